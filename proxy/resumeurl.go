package proxy

import (
	"crypto/hmac"
	"encoding/base64"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ssegate/ssegate/cache"
	"github.com/valyala/fasthttp"
)

// A signed resume URL opens one key's stream without a credential, for a
// browser's EventSource, which cannot send one:
//
//	/streams/{escaped key}?token=<tenant>.<expiry>.<mac>
//
// The mac is the deployment secret's HMAC (Proxy.mac, purpose "resume")
// over the tenant, the key and the expiry (Unix seconds), so a token is
// good for that key of that tenant until then, on every replica that
// shares the secret, and for nothing else. The tenant hash it carries is
// itself an HMAC: it names no credential.

// resumeURLHeader carries a keyed stream's signed resume URL.
const resumeURLHeader = "Ssegate-Resume-Url"

// resumeURLKey is the RequestCtx user value under which a keyed request's
// resume URL waits for the answer's head.
const resumeURLKey = "ssegate.resume_url"

// resumeToken signs sc until expires.
func (p *Proxy) resumeToken(sc cache.Scope, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	mac := p.mac([]byte("resume"), []byte(sc.Tenant), []byte(sc.Key), []byte(exp))
	return sc.Tenant + "." + exp + "." + base64.RawURLEncoding.EncodeToString(mac)
}

// offerResume makes sc's signed resume URL part of the answer's head
// (writeHead, client.answerHead); error answers do not carry it.
func (p *Proxy) offerResume(ctx *fasthttp.RequestCtx, sc cache.Scope) {
	u := "/streams/" + url.PathEscape(sc.Key) + "?token=" + p.resumeToken(sc, time.Now().Add(p.cfg.ResumeTokenTTL))
	ctx.SetUserValue(resumeURLKey, u)
}

// resumeURL is what offerResume left for ctx's answer, if anything.
func resumeURL(ctx *fasthttp.RequestCtx) string {
	u, _ := ctx.UserValue(resumeURLKey).(string)
	return u
}

// tokenScope checks a resume token for key: the scope it opens, or false
// when it was altered, is for another key, or has expired. Nothing about
// the key is looked at before it holds.
func (p *Proxy) tokenScope(token, key string, now time.Time) (cache.Scope, bool) {
	tenant, rest, ok := strings.Cut(token, ".")
	if !ok {
		return cache.Scope{}, false
	}
	exp, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return cache.Scope{}, false
	}
	mac, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return cache.Scope{}, false
	}
	want := p.mac([]byte("resume"), []byte(tenant), []byte(key), []byte(exp))
	if !hmac.Equal(mac, want) {
		return cache.Scope{}, false
	}
	secs, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || now.Unix() >= secs {
		return cache.Scope{}, false
	}
	return cache.Scope{Tenant: tenant, Key: key}, true
}
