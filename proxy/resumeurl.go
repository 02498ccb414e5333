package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// A signed resume URL opens one generation of one key's stream without a
// credential, for a browser's EventSource, which cannot send one:
//
//	../../streams/{escaped key}?token=<tenant>.<generation>.<expiry>.<mac>
//
// The mac is the deployment secret's HMAC (Proxy.mac, purpose "resume")
// over the tenant, the key, the generation and the expiry (Unix seconds),
// so a token is good for that generation of that key of that tenant until
// then, on every replica that shares the secret, and for nothing else. The
// tenant hash it carries is itself an HMAC: it names no credential.
//
// The URL is a relative reference, resolved against the URL of the request
// it answers (as a Location is): it climbs from that request's path to the
// directory /streams/ sits in, so an ssegate mounted under a path prefix
// behind a gateway gives a URL that goes through the same prefix.

// resumeURLHeader carries a keyed stream's signed resume URL.
const resumeURLHeader = "Ssegate-Resume-Url"

// resumeURLKey is the RequestCtx user value under which a keyed request's
// resume URL waits for the answer's head.
const resumeURLKey = "ssegate.resume_url"

// grantKey is the RequestCtx user value that holds the expiry of the token
// that authorised the request, if one did: no URL derived from it outlives
// it.
const grantKey = "ssegate.resume_grant"

// resumeSigner is the base64 of a token's mac. Strict: a mac has exactly
// one spelling, so a token altered in any character is refused.
var resumeSigner = base64.RawURLEncoding.Strict()

// resumeToken signs generation gen of sc until expires.
func (p *Proxy) resumeToken(sc cache.Scope, gen uint64, expires time.Time) string {
	g := strconv.FormatUint(gen, 10)
	exp := strconv.FormatInt(expires.Unix(), 10)
	m := p.resumeMAC(sc.Tenant, sc.Key, g, exp)
	return sc.Tenant + "." + g + "." + exp + "." + resumeSigner.EncodeToString(m[:])
}

func (p *Proxy) resumeMAC(tenant, key, gen, exp string) [sha256.Size]byte {
	m := p.newMAC("resume")
	m.add(tenant)
	m.add(key)
	m.add(gen)
	m.add(exp)
	return p.sumMAC(m)
}

// offerResume makes the signed resume URL of generation gen of sc part of
// the answer's head (writeHead, clientConn.answerHead); error answers do not
// carry it. It expires -ttl from now, or with the token that authorised
// the request if that is sooner: polling a URL does not prolong it.
func (p *Proxy) offerResume(ctx *fasthttp.RequestCtx, sc cache.Scope, gen uint64) {
	expires := time.Now().Add(p.cfg.ResumeTokenTTL)
	if g, ok := ctx.UserValue(grantKey).(time.Time); ok && g.Before(expires) {
		expires = g
	}
	u := relativeRoot(ctx.URI().PathOriginal()) + "streams/" + url.PathEscape(sc.Key) + "?token=" + p.resumeToken(sc, gen, expires)
	ctx.SetUserValue(resumeURLKey, u)
}

// relativeRoot is the relative reference that leads from a request for
// path to the root it was served under: one "../" per directory of path
// ("./" at the root). Only a literal "/" separates segments; an escaped one
// is part of its segment, for the client as for ssegate.
func relativeRoot(path []byte) string {
	n := strings.Count(string(path), "/") - 1
	if n <= 0 {
		return "./"
	}
	return strings.Repeat("../", n)
}

// resumeURL is what offerResume left for ctx's answer, if anything.
func resumeURL(ctx *fasthttp.RequestCtx) string {
	u, _ := ctx.UserValue(resumeURLKey).(string)
	return u
}

// resumeGrant is what a valid token opens: one generation of one key,
// until its expiry.
type resumeGrant struct {
	sc      cache.Scope
	gen     uint64
	expires time.Time
}

// tokenGrant checks a resume token for key: what it opens, or false when
// it was altered, is for another key, or has expired. Nothing about the
// key is looked at before it holds.
func (p *Proxy) tokenGrant(token, key string, now time.Time) (resumeGrant, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 4 {
		return resumeGrant{}, false
	}
	tenant, g, exp, sig := parts[0], parts[1], parts[2], parts[3]
	mac, err := resumeSigner.DecodeString(sig)
	if want := p.resumeMAC(tenant, key, g, exp); err != nil || !hmac.Equal(mac, want[:]) {
		return resumeGrant{}, false
	}
	gen, gerr := strconv.ParseUint(g, 10, 64)
	secs, err := strconv.ParseInt(exp, 10, 64)
	if gerr != nil || err != nil || now.Unix() >= secs {
		return resumeGrant{}, false
	}
	return resumeGrant{sc: cache.Scope{Tenant: tenant, Key: key}, gen: gen, expires: time.Unix(secs, 0)}, true
}
