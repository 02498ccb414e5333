package proxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

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

// accounts returns the accounts a request's key is counted against by
// every per-tenant bound (cache.Scope.Accounts): one for each distinct
// secret value it carries, an HMAC keyed by the deployment secret of the
// value alone, whatever header or parameter carries it, since providers
// take one secret in more than one place (Azure's api-key or a Bearer
// token, Gemini's header or ?key=). Authorization is taken without its
// Bearer scheme and surrounding spaces. -tenant-header values are no
// account: they are not secrets, and a client could name another's to
// fill its account; they only make the tenant. A request with no secret
// value has none (nil: its tenant is its account). With
// Config.AccountHeader, a request that carries that header has its value
// as its one account instead: the customer a trusted layer in front
// named. n is how many distinct
// values it carries, counted up to Config.MaxCredentials+1: past the
// bound, accounts is nil and the request is to be refused.
func (p *Proxy) accounts(ctx *fasthttp.RequestCtx) (accounts []string, n int) {
	var vals [8][]byte
	seen := vals[:0]
	limit := p.cfg.MaxCredentials
	add := func(v []byte) {
		if len(v) == 0 || len(seen) > limit {
			return
		}
		for _, s := range seen {
			if bytes.Equal(s, v) {
				return
			}
		}
		seen = append(seen, v)
	}
	h := &ctx.Request.Header
	for _, name := range credentialHeaders {
		for _, v := range h.PeekAll(name) {
			if name == "authorization" {
				v = bearerValue(v)
			}
			add(v)
		}
	}
	for _, v := range ctx.QueryArgs().PeekMulti(credentialParam) {
		add(v)
	}
	if len(seen) > limit {
		return nil, len(seen)
	}
	if name := p.cfg.AccountHeader; name != "" {
		if v := h.Peek(name); len(v) > 0 {
			m := p.newMAC("account-header")
			m.addBytes(v)
			sum := p.sumMAC(m)
			return []string{hex.EncodeToString(sum[:16])}, len(seen)
		}
	}
	if len(seen) == 0 {
		return nil, 0
	}
	accounts = make([]string, len(seen))
	for i, v := range seen {
		m := p.newMAC("account")
		m.addBytes(v)
		sum := p.sumMAC(m)
		accounts[i] = hex.EncodeToString(sum[:16])
	}
	return accounts, len(seen)
}

// bearerValue is an Authorization value without the spaces around it and
// its Bearer scheme (of any case), so that "Bearer k" and "k" are one
// account.
func bearerValue(v []byte) []byte {
	v = bytes.TrimSpace(v)
	if len(v) > len("bearer ") && bytes.EqualFold(v[:len("bearer ")], []byte("bearer ")) {
		v = bytes.TrimSpace(v[len("bearer "):])
	}
	return v
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

// keyTenant returns the tenant whose keys the request may use: ok is
// false for a request without a credential under AnonymousKeys deny, which
// may use none, not even what a replica that allowed them left in a
// shared store.
func (p *Proxy) keyTenant(ctx *fasthttp.RequestCtx) (tenant string, ok bool) {
	t, cred := p.tenant(ctx)
	return t, cred || p.cfg.AnonymousKeys != AnonymousDeny
}

// keyScope is scope for a key the request gave, once it is a valid one
// (400 invalid_idempotency_key otherwise).
func (p *Proxy) keyScope(ctx *fasthttp.RequestCtx, key string) (cache.Scope, bool) {
	if err := validKey(key); err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return cache.Scope{}, false
	}
	return p.scope(ctx, key)
}

// pathScope is keyScope for the {key} of /keys/{key}.
func (p *Proxy) pathScope(ctx *fasthttp.RequestCtx) (cache.Scope, bool) {
	key, err := keyFromPath(ctx, "/keys/")
	if err != nil {
		p.refuse(ctx, causeInvalidKey, err.Error())
		return cache.Scope{}, false
	}
	return p.scope(ctx, key)
}

// scope returns the scope of key for the request's tenant, with the
// accounts its bounds count it against (Proxy.accounts). A request
// without a credential, under AnonymousKeys deny, gets 401 and ok false;
// one with more than MaxCredentials distinct credential values, 400.
func (p *Proxy) scope(ctx *fasthttp.RequestCtx, key string) (sc cache.Scope, ok bool) {
	t, ok := p.keyTenant(ctx)
	if !ok {
		p.refuse(ctx, causeCredentialRequired, "")
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="ssegate"`)
		return cache.Scope{}, false
	}
	accounts, n := p.accounts(ctx)
	if n > p.cfg.MaxCredentials {
		p.refuse(ctx, causeTooManyCredentials, fmt.Sprintf("more than %d", p.cfg.MaxCredentials))
		return cache.Scope{}, false
	}
	return cache.Scope{Tenant: t, Key: key, Accounts: accounts}, true
}
