package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"

	"github.com/valyala/fasthttp"
)

// credentialHeaders carry the providers' API keys: OpenAI's and most
// others' Authorization, Anthropic's x-api-key, Azure OpenAI's api-key and
// Gemini's x-goog-api-key. The tenant hashes them in this order, then the
// key query parameter, then Config.TenantHeaders.
var credentialHeaders = []string{"authorization", "x-api-key", "api-key", "x-goog-api-key"}

// credentialParam is the query parameter that carries a credential
// (Gemini's ?key=). It is part of the tenant and not of the fingerprint.
const credentialParam = "key"

// anonymous is the tenant of a request that carries no credential.
const anonymous = "anonymous"

// tenant returns the hash that scopes keys to the credentials the request
// carries: an HMAC, keyed by the deployment secret, of every value of
// every credential header and of the key query parameter, each with its
// name, so that a value moved to another header is another tenant. A
// request with none of them is the anonymous tenant, and ok is false.
func (p *Proxy) tenant(ctx *fasthttp.RequestCtx) (t string, ok bool) {
	m := p.newMAC("tenant")
	h := &ctx.Request.Header
	header := func(name string) {
		for _, v := range h.PeekAll(name) {
			if len(v) > 0 {
				writePart(m, []byte(name))
				writePart(m, v)
				ok = true
			}
		}
	}
	for _, name := range credentialHeaders {
		header(name)
	}
	for _, v := range ctx.QueryArgs().PeekMulti(credentialParam) {
		if len(v) > 0 {
			writePart(m, []byte("?"+credentialParam)) // no header is named so
			writePart(m, v)
			ok = true
		}
	}
	for _, name := range p.cfg.TenantHeaders {
		header(name)
	}
	if !ok {
		return anonymous, false
	}
	return hex.EncodeToString(m.Sum(nil)[:16]), true
}

// mac returns the HMAC-SHA256 of parts keyed by the deployment secret
// (Config.Secret), which every replica sharing a store shares. Each part
// is length-prefixed, so no two lists of parts hash alike; the first part
// names the purpose ("tenant", "resume", …), so that a MAC made for one
// purpose is never valid for another.
func (p *Proxy) mac(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, p.cfg.Secret)
	for _, b := range parts {
		writePart(m, b)
	}
	return m.Sum(nil)
}

// newMAC starts a MAC for purpose, as mac does, to which parts are then
// written with writePart.
func (p *Proxy) newMAC(purpose string) hash.Hash {
	m := hmac.New(sha256.New, p.cfg.Secret)
	writePart(m, []byte(purpose))
	return m
}

func writePart(h hash.Hash, b []byte) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
	h.Write(b)
}
