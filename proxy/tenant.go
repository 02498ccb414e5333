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
				m.add(name)
				m.addBytes(v)
				ok = true
			}
		}
	}
	for _, name := range credentialHeaders {
		header(name)
	}
	for _, v := range ctx.QueryArgs().PeekMulti(credentialParam) {
		if len(v) > 0 {
			m.add("?" + credentialParam) // no header is named so
			m.addBytes(v)
			ok = true
		}
	}
	for _, name := range p.cfg.TenantHeaders {
		header(name)
	}
	if !ok {
		p.putMAC(m)
		return anonymous, false
	}
	sum := p.sumMAC(m)
	return hex.EncodeToString(sum[:16]), true
}

// A mac is the HMAC-SHA256 of a list of parts keyed by the deployment
// secret (Config.Secret), which every replica sharing a store shares. Each
// part is length-prefixed, so no two lists of parts hash alike; the first
// part names the purpose ("tenant", "resume", …), so that a MAC made for
// one purpose is never valid for another. Its states are reused
// (Proxy.macs): hmac.New hashes the secret and allocates anew, on every
// keyed request twice.
type mac struct {
	h     hash.Hash
	parts []byte // the parts, length-prefixed, hashed at once by sumMAC
	sum   [sha256.Size]byte
}

// zeroBlock overwrites a hash's buffer (putMAC).
var zeroBlock [sha256.BlockSize]byte

// newMAC starts a MAC for purpose, to which parts are then added; sumMAC
// ends it.
func (p *Proxy) newMAC(purpose string) *mac {
	m, _ := p.macs.Get().(*mac)
	if m == nil {
		m = &mac{h: hmac.New(sha256.New, p.cfg.Secret)}
	}
	m.parts = m.parts[:0]
	m.add(purpose)
	return m
}

func (m *mac) add(s string) {
	m.parts = binary.AppendUvarint(m.parts, uint64(len(s)))
	m.parts = append(m.parts, s...)
}

func (m *mac) addBytes(b []byte) {
	m.parts = binary.AppendUvarint(m.parts, uint64(len(b)))
	m.parts = append(m.parts, b...)
}

// sumMAC returns m's MAC, and m to be reused.
func (p *Proxy) sumMAC(m *mac) (sum [sha256.Size]byte) {
	m.h.Write(m.parts) // m.h is new or was reset by putMAC
	// Summed into m: a local array passed to Sum would escape.
	sum = [sha256.Size]byte(m.h.Sum(m.sum[:0]))
	p.putMAC(m)
	return sum
}

// putMAC gives m back to be reused, reset, with its parts (credentials
// among them) wiped first, and so the hash's buffer: the last partial
// block it hashed (the credential's end) stays in it through a reset, so
// a block's worth of zeros goes through the buffer before the reset that
// leaves it ready. One made for a huge part is let go.
func (p *Proxy) putMAC(m *mac) {
	clear(m.parts)
	m.h.Reset()
	m.h.Write(zeroBlock[:m.h.BlockSize()-1])
	m.h.Reset()
	if cap(m.parts) <= 4<<10 {
		p.macs.Put(m)
	}
}
