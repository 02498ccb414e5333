package redis

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/cache/internal/storetest"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/redistest"
)

// renewLease is the lease of the tests that call renewAll themselves: long
// enough that the renewal loop does not tick during the test.
const renewLease = time.Minute

// renewStores starts a private Redis and n stores on it (replicas) with
// renewLease.
func renewStores(tb testing.TB, n int) (string, []*Store) {
	tb.Helper()
	srv := redistest.Start(tb)
	rs := make([]*Store, n)
	for i := range rs {
		rs[i] = newRedis(tb, srv.Addr, "renew", func(c *Config) { c.Lease = renewLease })
	}
	return srv.Addr, rs
}

// redisCalls returns how many times the server at addr ran each command
// (INFO commandstats), inner commands of scripts included.
func redisCalls(tb testing.TB, addr string) map[string]int64 {
	tb.Helper()
	stats, err := redistest.Command(addr, 5*time.Second, "INFO", "commandstats")
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	calls := map[string]int64{}
	for _, l := range strings.Split(stats, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		calls[cmd], _ = strconv.ParseInt(v, 10, 64)
	}
	return calls
}

// leaseLeft returns the time to live of sc's lease (negative: none).
func leaseLeft(tb testing.TB, r *Store, sc cache.Scope) time.Duration {
	tb.Helper()
	n, err := r.c.Do(context.Background(), r.c.B().Pttl().Key(r.keys(sc).lease).Build()).AsInt64()
	if err != nil {
		tb.Fatalf("PTTL: %v", err)
	}
	return time.Duration(n) * time.Millisecond
}

// shortenLease leaves sc's lease a second to live, so that a renewal shows.
func shortenLease(tb testing.TB, r *Store, sc cache.Scope) {
	tb.Helper()
	if err := r.c.Do(context.Background(), r.c.B().Pexpire().Key(r.keys(sc).lease).Milliseconds(1000).Build()).Error(); err != nil {
		tb.Fatal(err)
	}
}

// TestRedisRenewalsBatched: on a standalone Redis a replica renews its
// owners' leases in batches, one script call for up to maxBatchItems of
// them, and every lease is renewed and every owner's progress reaches st.
func TestRedisRenewalsBatched(t *testing.T) {
	t.Parallel()
	const owners = 2*maxBatchItems + 1
	addr, rs := renewStores(t, 1)
	r := rs[0]
	scs := make([]cache.Scope, owners)
	fs := make([]*cache.Flight, owners)
	for i := range scs {
		scs[i] = cache.Scope{Tenant: "t", Key: strconv.Itoa(i)}
		fs[i] = rbegin(t, r, scs[i], "fp").Flight
		storetest.StartStream(t, fs[i])
		storetest.AppendN(t, fs[i], 1, i%5+1)
	}
	r.renewAll() // sends the marks
	for _, sc := range scs {
		shortenLease(t, r, sc)
	}
	before := redisCalls(t, addr)
	r.renewAll()
	after := redisCalls(t, addr)
	if n, most := after["evalsha"]+after["eval"]-before["evalsha"]-before["eval"], int64(3); n > most {
		t.Errorf("script calls for %d owners' renewals: got %d; want at most %d", owners, n, most)
	}
	for i, sc := range scs {
		if left := leaseLeft(t, r, sc); left < renewLease/2 {
			t.Fatalf("owner %d: lease %v left after the renewal; want about %v", i, left, renewLease)
		}
		if ki, ok := r.Info(sc); !ok || ki.State != cache.StateExecutionStarted || ki.Events != i%5+1 {
			t.Fatalf("owner %d: key info %+v (found %v); want execution_started with %d events", i, ki, ok, i%5+1)
		}
	}
	for _, f := range fs {
		f.Fail(cache.StateFailedRetryable, "test over", nil)
	}
}

// TestRedisRenewalBatchAnswers: each owner of one batch gets its own
// answer: one whose key another replica took is fenced, one whose journal
// a follower asked for starts mirroring, and the others keep their leases.
func TestRedisRenewalBatchAnswers(t *testing.T) {
	t.Parallel()
	addr, rs := renewStores(t, 2)
	a, b := rs[0], rs[1]
	var scs [4]cache.Scope
	var fs [4]*cache.Flight
	for i := range scs {
		scs[i], fs[i], _ = ownedStream(t, a, "k"+strconv.Itoa(i), 10)
	}
	taken, asked := scs[0], scs[1]
	a.renewAll() // loads the script; the fence and the ask are found by the next renewal
	expireLease(t, a, taken)
	if got := rbegin(t, b, taken, "fp"); got.Decision != cache.Miss {
		t.Fatalf("claim after the lease expired: got %v; want miss", got.Decision)
	}
	askDirectly(t, a, asked)
	for _, sc := range scs[2:] {
		shortenLease(t, a, sc)
	}
	m := monitor(t, addr)
	a.renewAll()
	// The top-level script calls naming the leases of the owners that only
	// renew: the fence's and the mirror's scripts name neither.
	calls := 0
	for _, l := range m.stop() {
		cmd := strings.ToLower(l)
		if !strings.Contains(l, " [0 lua] ") && (strings.Contains(cmd, `] "evalsha" `) || strings.Contains(cmd, `] "eval" `)) &&
			(strings.Contains(l, `"`+a.keys(scs[2]).lease+`"`) || strings.Contains(l, `"`+a.keys(scs[3]).lease+`"`)) {
			calls++
		}
	}
	if calls != 1 {
		t.Errorf("script calls renewing two owners of one replica: got %d; want 1", calls)
	}
	if state, reason, _ := waitOutcome(t, fs[0]); state == cache.StateCommitted || reason != cache.ReasonGenerationLost {
		t.Fatalf("owner whose key was taken: got %v (%s); want a failure with %s", state, reason, cache.ReasonGenerationLost)
	}
	eventually(t, 10*time.Second, func() error {
		if n := journalLen(t, a, asked); n != 10 {
			return fmt.Errorf("journal of the asked owner: %d entries; want its 10 events (no start entry is written)", n)
		}
		return nil
	})
	for i, f := range fs[1:] {
		select {
		case <-f.Done():
			t.Fatalf("owner %d ended: %v", i+1, waitDone(t, f, 0))
		default:
		}
		if left := leaseLeft(t, a, scs[i+1]); left < renewLease/2 {
			t.Fatalf("owner %d: lease %v left after the renewal; want about %v", i+1, left, renewLease)
		}
		f.Fail(cache.StateFailedRetryable, "test over", nil)
	}
}

// waitOutcome waits for f to end and returns its outcome.
func waitOutcome(tb testing.TB, f *cache.Flight) (cache.State, string, []byte) {
	tb.Helper()
	waitDone(tb, f, 10*time.Second)
	return f.Outcome()
}

// TestRedisRenewalAfterFailure: a renewal whose answer did not come makes
// the next one send again only what it sent: a renewal that carried
// neither the marks nor the extension of st and j costs the next no HSET
// and no PEXPIRE of st or j, only its lease's.
func TestRedisRenewalAfterFailure(t *testing.T) {
	t.Parallel()
	addr, rs := renewStores(t, 1)
	r := rs[0]
	var scs [3]cache.Scope
	var fs [3]*cache.Flight
	for i := range scs {
		scs[i], fs[i], _ = ownedStream(t, r, "k"+strconv.Itoa(i), 10)
	}
	r.renewAll() // sends the marks
	// Redis takes no command for longer than a renewal waits: the renewal
	// fails, whether it ran (once the pause is over) unknown.
	if _, err := redistest.Command(addr, 5*time.Second, "CLIENT", "PAUSE", "2500", "ALL"); err != nil {
		t.Fatal(err)
	}
	unavailable := r.Stats().Unavailable
	r.renewAll()
	// At least: the inbox's read may fail during the pause too.
	if n := r.Stats().Unavailable - unavailable; n < int64(len(fs)) {
		t.Fatalf("renewals failed during the pause: got %d; want %d", n, len(fs))
	}
	if _, err := redistest.Command(addr, 10*time.Second, "PING"); err != nil { // answered once the pause is over
		t.Fatal(err)
	}
	for _, sc := range scs {
		shortenLease(t, r, sc)
	}
	before := redisCalls(t, addr)
	r.renewAll()
	after := redisCalls(t, addr)
	// Each lease is extended by a PEXPIRE of its own; st and j are not. A
	// tick of the store's own renewal loop may fall in between, with the
	// same commands for the same owners.
	if n := after["hset"] - before["hset"]; n != 0 {
		t.Errorf("hset: %d calls by the renewals after a failed one that sent no marks; want none", n)
	}
	if n := after["pexpire"] - before["pexpire"]; n == 0 || n%int64(len(fs)) != 0 {
		t.Errorf("pexpire: %d calls by the renewals after a failed one that sent no extension; want one per lease (%d) a round", n, len(fs))
	}
	for i, sc := range scs {
		if left := leaseLeft(t, r, sc); left < renewLease/2 {
			t.Fatalf("owner %d: lease %v left after the renewal; want about %v", i, left, renewLease)
		}
		fs[i].Fail(cache.StateFailedRetryable, "test over", nil)
	}
}

// TestRedisRenewalSendsWhatMoved: a renewal sets only the fields of st
// that moved since the renewals sent them (an event stream's events and
// bytes), and none when nothing moved; the key info other replicas read
// follows the owner all the same.
func TestRedisRenewalSendsWhatMoved(t *testing.T) {
	t.Parallel()
	addr, rs := renewStores(t, 2)
	a, b := rs[0], rs[1]
	sc, f, _ := ownedStream(t, a, "k", 10)
	f.Mark(cache.StateExecutionStarted, 1, 200) // again: it does not move
	a.renewAll()
	storetest.AppendN(t, f, 11, 5)
	hsets := func() []string {
		t.Helper()
		m := monitor(t, addr)
		a.renewAll()
		var hs []string
		for _, l := range m.stop() {
			if strings.Contains(l, " [0 lua] ") && strings.Contains(strings.ToLower(l), `"hset" `) {
				hs = append(hs, l)
			}
		}
		return hs
	}
	hs := hsets()
	if len(hs) != 1 || !strings.Contains(hs[0], `"events" "15"`) || !strings.Contains(hs[0], `"bytes"`) ||
		strings.Contains(hs[0], `"state"`) || strings.Contains(hs[0], `"attempts"`) || strings.Contains(hs[0], `"status"`) {
		t.Fatalf("the renewal after 5 events: HSET %q; want one setting events, bytes and updated only", hs)
	}
	if ki, ok := b.Info(sc); !ok || ki.State != cache.StateExecutionStarted || ki.Attempts != 1 || ki.LastStatus != 200 || ki.Events != 15 {
		t.Fatalf("the other replica's key info: %+v (found %v); want execution_started, attempt 1, status 200, 15 events", ki, ok)
	}
	if hs := hsets(); len(hs) != 0 {
		t.Fatalf("a renewal with nothing moved: HSET %q; want none", hs)
	}
	f.Fail(cache.StateFailedRetryable, "test over", nil)
}

// monitored is what a MONITOR connection saw.
type monitored struct {
	tb    testing.TB
	addr  string
	lines chan []string
}

// monitor starts watching the commands the server at addr runs.
func monitor(tb testing.TB, addr string) *monitored {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	rd := bufio.NewReader(c)
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		tb.Fatal(err)
	}
	if l, err := rd.ReadString('\n'); err != nil || l != "+OK\r\n" {
		tb.Fatalf("MONITOR: %q %v", l, err)
	}
	m := &monitored{tb: tb, addr: addr, lines: make(chan []string, 1)}
	go func() {
		var ls []string
		for {
			l, err := rd.ReadString('\n')
			if err != nil || strings.Contains(strings.ToLower(l), `"echo" "monitor-end"`) {
				m.lines <- ls
				return
			}
			ls = append(ls, l)
		}
	}()
	return m
}

// stop returns the commands the server ran since monitor: those before
// an ECHO it sends.
func (m *monitored) stop() []string {
	m.tb.Helper()
	if _, err := redistest.Command(m.addr, 5*time.Second, "ECHO", "monitor-end"); err != nil {
		m.tb.Fatal(err)
	}
	select {
	case ls := <-m.lines:
		return ls
	case <-time.After(10 * time.Second):
		m.tb.Fatal("MONITOR: the end marker did not come")
		return nil
	}
}

// TestRedisClaimAgainForgetsModel: a key claimed again after a failed
// generation shows, on another replica, the new generation's model and
// fallbacks (none yet), not the last generation's.
func TestRedisClaimAgainForgetsModel(t *testing.T) {
	t.Parallel()
	_, rs := renewStores(t, 2)
	a, b := rs[0], rs[1]
	sc := cache.Scope{Tenant: "t", Key: "again"}
	// Each generation: its model (if any) set, a few events, a renewal,
	// then what b reads, and a failure that frees the key.
	for i, c := range []struct {
		model     string
		fallbacks []cache.Fallback
	}{{"m2", []cache.Fallback{{Model: "m1", Reason: "overloaded"}}}, {"", nil}} {
		f := rbegin(t, a, sc, "fp").Flight
		if c.model != "" {
			f.SetModel(c.model, c.fallbacks)
		}
		storetest.StartStream(t, f)
		storetest.AppendN(t, f, 1, 3)
		a.renewAll()
		if ki, _ := b.Info(sc); ki.Model != c.model || len(ki.Fallbacks) != len(c.fallbacks) {
			t.Errorf("generation %d's key info: model %q, fallbacks %v; want %q and %d", i+1, ki.Model, ki.Fallbacks, c.model, len(c.fallbacks))
		}
		f.Fail(cache.StateFailedRetryable, "upstream_reset", nil)
		waitDone(t, f, 5*time.Second)
	}
}

// TestRedisRenewalLostSendsAgain: a renewal whose answer was lost makes
// the next one send again the fields it carried, and only those: the
// fields earlier renewals set are known to be in Redis.
func TestRedisRenewalLostSendsAgain(t *testing.T) {
	t.Parallel()
	_, rs := renewStores(t, 1)
	_, f, _ := ownedStream(t, rs[0], "lost", 10)
	o := f.Backend().(*owner)
	fields := renewal.fields
	first := o.renewal(time.Since(o.t0))
	o.renewed(first, 1, nil)
	f.Mark(cache.StateExecutionStarted, 2, 200) // attempts moved; events did not
	lost := o.renewal(time.Since(o.t0))
	if got := fields(lost); !slices.Equal(got, []string{"attempts"}) {
		t.Fatalf("a renewal after the attempts moved sets %v; want [attempts]", got)
	}
	o.renewed(lost, 0, errors.New("reply lost"))
	if got := fields(o.renewal(time.Since(o.t0))); !slices.Equal(got, []string{"attempts"}) {
		t.Errorf("the renewal after a lost one sets %v; want [attempts] again, and no field sent before it", got)
	}
	f.Fail(cache.StateFailedRetryable, "test over", nil)
}

// TestRedisRenewScriptItems: one call of renewScript reads each item's
// keys and values where its flags say they are, whatever the items before
// it carried: an extension (and j), moved fields, neither, a fenced
// owner, and a lease that expired while st still names its owner.
func TestRedisRenewScriptItems(t *testing.T) {
	t.Parallel()
	_, rs := renewStores(t, 1)
	r := rs[0]
	ctx := context.Background()
	var os []*owner
	for i := range 5 {
		_, f, _ := ownedStream(t, r, "items"+strconv.Itoa(i), 3)
		os = append(os, f.Backend().(*owner))
	}
	item := func(o *owner, extend bool, tok string, fields ...string) batchItem {
		fl := "n"
		keys := o.k.withoutResult[:2]
		if extend {
			fl, keys = "e", o.k.withoutResult
		}
		args := []string{"", tok, o.gen}
		for i := 0; i < len(fields); i += 2 {
			fl += strconv.Itoa(slices.Index(renewedFields[:], fields[i]) + 1)
			args = append(args, fields[i+1])
		}
		if len(fields) > 0 {
			args = append(args, "1700000000000")
		}
		args[0] = fl
		return batchItem{keys: keys, args: args}
	}
	r.renewAll() // the owners' own renewals have nothing left to set
	expireLease(t, r, os[4].f.Scope)
	for _, o := range []*owner{os[0], os[2]} { // an extension shows
		if err := r.c.Do(ctx, r.c.B().Pexpire().Key(o.k.st).Milliseconds(100_000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	out, err := r.renewRun(ctx, []batchItem{
		item(os[0], true, os[0].tok, "events", "11", "bytes", "111"),
		item(os[1], false, os[1].tok),
		item(os[2], true, "stranger", "events", "99"),
		item(os[3], false, os[3].tok, "state", string(cache.StateCommitUnknown), "attempts", "3", "bytes", "333"),
		item(os[4], false, os[4].tok, "events", "44"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{1, 1, 0, 1, 1} {
		if n, err := out[i].AsInt64(); err != nil || n != want {
			t.Errorf("item %d: answer %d, %v; want %d", i, n, err, want)
		}
	}
	hget := func(o *owner, f string) string {
		v, _ := r.c.Do(ctx, r.c.B().Hget().Key(o.k.st).Field(f).Build()).ToString()
		return v
	}
	for _, c := range []struct {
		o            *owner
		field, value string
	}{{os[0], "events", "11"}, {os[0], "bytes", "111"}, {os[0], "updated", "1700000000000"},
		{os[3], "state", string(cache.StateCommitUnknown)}, {os[3], "attempts", "3"},
		{os[3], "bytes", "333"}, {os[4], "events", "44"}} {
		if got := hget(c.o, c.field); got != c.value {
			t.Errorf("%s %s: %q; want %q", c.o.k.h[:6], c.field, got, c.value)
		}
	}
	if got := hget(os[1], "updated"); got == "1700000000000" {
		t.Error("an item that moved nothing set updated")
	}
	if got := hget(os[2], "events"); got == "99" {
		t.Error("a fenced item set st")
	}
	tok, err := r.c.Do(ctx, r.c.B().Get().Key(os[4].k.lease).Build()).ToString()
	if err != nil || tok != os[4].tok {
		t.Errorf("an expired lease: %q, %v; want it set again to the owner's token", tok, err)
	}
	pttl := func(key string) time.Duration {
		n, err := r.c.Do(ctx, r.c.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(n) * time.Millisecond
	}
	if left := pttl(os[4].k.lease); left <= 0 || left > r.cfg.Lease {
		t.Errorf("the lease set again expires in %v; want within a lease (%v)", left, r.cfg.Lease)
	}
	// The item before it set three fields; the next one's HSET takes none
	// of them.
	if got := hget(os[4], "bytes"); got == "333" {
		t.Error("an item's HSET took a field of the item before it")
	}
	if got := hget(os[4], "state"); got == string(cache.StateCommitUnknown) {
		t.Error("an item's HSET took the state of the item before it")
	}
	// Extended: st lives LiveTTL from now (its generation has no journal
	// to extend); the fenced item's is as it was.
	if left := pttl(os[0].k.st); left < r.cfg.LiveTTL-time.Minute {
		t.Errorf("st of an extending item expires in %v; want about %v", left, r.cfg.LiveTTL)
	}
	if left := pttl(os[2].k.st); left > 100*time.Second {
		t.Errorf("a fenced item's st expires in %v: extended", left)
	}
	for _, o := range os {
		o.f.Fail(cache.StateFailedRetryable, "test over", nil)
	}
}

// fields returns the names of the fields of st the renewal sets.
func (rn renewal) fields() []string {
	var fs []string
	for i, f := range renewedFields {
		if rn.moved&(1<<i) != 0 {
			fs = append(fs, f)
		}
	}
	return fs
}
