package cache

import (
	"bytes"
	"errors"
	"github.com/ssegate/ssegate/cache/internal/wiretest"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestJournalSubscribers follows one generation of 5,000 events with
// subscribers that join before, during and concurrently with the appends;
// each must get exactly the events after its position, then the end. It
// runs in a synctest bubble, where time passes only while every goroutine
// waits: the waits for the producer and the followers fail at once when
// one of them is stuck, and never because the machine is slow.
func TestJournalSubscribers(t *testing.T) {
	t.Parallel()
	const (
		total = 5000
		pause = 2000 // the producer waits here so mid-stream joins are mid-stream
		k     = 1234
	)
	type follower struct {
		name  string
		after uint64
		got   []byte
		ended bool
	}
	var (
		followers []*follower
		gen       uint64
		res       *Result
	)
	synctest.Test(t, func(t *testing.T) {
		m := newMemory(t, Config{})
		f := claim(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
		f.SetHead(streamHead)
		gen = f.Gen

		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		subscribe := func(name string, after uint64) {
			s, err := f.Subscribe(after)
			if err != nil {
				t.Errorf("%s: Subscribe(%d): got %v; want none", name, after, err)
				return
			}
			fl := &follower{name: name, after: after}
			mu.Lock()
			followers = append(followers, fl)
			mu.Unlock()
			wg.Go(func() {
				defer s.Close()
				fl.got, fl.ended = wiretest.Follow(s, 30*time.Second)
			})
		}

		subscribe("before appends", 0)
		idle, err := f.Subscribe(0) // never reads until the end
		if err != nil {
			t.Fatalf("idle Subscribe: got %v; want none", err)
		}

		paused, resume, produced := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			for seq := 1; seq <= total; seq++ {
				if _, err := f.Append("", strconv.Itoa(seq)); err != nil {
					produced <- err
					return
				}
				if seq == pause {
					close(paused)
					<-resume
				}
			}
			produced <- nil
		}()

		<-paused
		subscribe("mid-stream at 0", 0)
		subscribe("mid-stream at k", k)
		subscribe("mid-stream at the head", pause)
		// Two subscribe while the producer runs: one from 0, one from wherever
		// the journal has got to.
		var joined sync.WaitGroup
		joined.Go(func() { subscribe("concurrent at 0", 0) })
		joined.Go(func() { subscribe("concurrent at current", uint64(f.Events())) })
		close(resume)
		joined.Wait()
		// An idle subscriber must not hold the producer up: a producer
		// that waited for it would never finish.
		select {
		case err := <-produced:
			if err != nil {
				t.Fatalf("Append: got %v; want none", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("3,000 appends with an idle subscriber: not done after 10s; want no wait for it")
		}
		if !f.Commit(nil) {
			t.Error("Commit: got stored false; want true")
		}
		wg.Wait()

		res = begin(t, m, f.Scope, "fp").Result
		if res == nil {
			t.Fatal("Begin after Commit: got no result; want a hit")
		}
		fl := &follower{name: "idle"}
		fl.got, fl.ended = readAll(idle)
		followers = append(followers, fl)
		if got := m.Stats().LiveBytes; got != 0 {
			t.Errorf("LiveBytes after Commit: got %d; want 0", got)
		}
	})
	for _, fl := range followers {
		t.Run(fl.name, func(t *testing.T) {
			if !fl.ended {
				t.Fatalf("got ended=false after %d bytes; want true after Commit", len(fl.got))
			}
			wiretest.CheckSeq(t, wiretest.ParseWire(t, fl.got), gen, fl.after, total)
			want, err := res.After(fl.after)
			if err != nil || !bytes.Equal(fl.got, want) {
				t.Errorf("got %d bytes; want the result's %d bytes after %d (err %v)", len(fl.got), len(want), fl.after, err)
			}
		})
	}
}

// TestIdleSubscribersDoNotBlockAppend holds many subscribers that never
// read; the producer's 5,000 appends must not wait for any of them. In a
// synctest bubble, the watchdog's 10 s pass only while every goroutine
// waits: at once if the producer waits for a subscriber, never because
// the machine is slow.
func TestIdleSubscribersDoNotBlockAppend(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const total = 5000
		m := newMemory(t, Config{Limits: Limits{MaxSubscribers: 100}})
		f := claim(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
		f.SetHead(streamHead)
		subs := make([]*Sub, 100)
		for i := range subs {
			s, err := f.Subscribe(0)
			if err != nil {
				t.Fatalf("Subscribe %d: got %v; want none", i, err)
			}
			subs[i] = s
		}
		done := make(chan struct{})
		var appended atomic.Int64 // not f.Events(): a stuck Append holds the flight's lock
		go func() {
			defer close(done)
			for seq := 1; seq <= total; seq++ {
				if _, err := f.Append("", strconv.Itoa(seq)); err != nil {
					t.Errorf("Append %d: got %v; want none", seq, err)
					return
				}
				appended.Add(1)
			}
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("5,000 appends with 100 idle subscribers: not done after 10s (%d appended); want no wait for them", appended.Load())
		}
		f.Commit(nil)
		for i, s := range subs {
			p, ended := readAll(s)
			if !ended {
				t.Fatalf("idle subscriber %d: got ended=false; want true", i)
			}
			if i == 0 || i == len(subs)-1 {
				wiretest.CheckSeq(t, wiretest.ParseWire(t, p), f.Gen, 0, total)
			}
		}
	})
}

func TestSubscribe(t *testing.T) {
	t.Parallel()
	m := newMemory(t, Config{})
	f := claim(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
	f.SetHead(streamHead)
	appendN(t, f, 1, 3)
	tests := []struct {
		after   uint64
		wantErr error
	}{
		{0, nil}, {2, nil}, {3, nil}, {4, ErrPosition}, {1 << 40, ErrPosition},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatUint(tt.after, 10), func(t *testing.T) {
			s, err := f.Subscribe(tt.after)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got %v; want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			defer s.Close()
			select {
			case <-s.C():
			default:
				t.Fatal("C: got no signal after Subscribe; want one for the backlog")
			}
			p, ended := s.Read()
			if ended {
				t.Error("Read: got ended=true on a live flight; want false")
			}
			if len(p) == 0 {
				if tt.after != 3 {
					t.Fatalf("Read: got nothing; want events after %d", tt.after)
				}
			} else {
				wiretest.CheckSeq(t, wiretest.ParseWire(t, p), f.Gen, tt.after, 3)
			}
			if got := s.Position(); got != 3 {
				t.Errorf("Position: got %d; want 3", got)
			}
		})
	}

	t.Run("after the end", func(t *testing.T) {
		g := claim(t, m, Scope{Tenant: "t", Key: "ended"}, "fp")
		g.SetHead(streamHead)
		appendN(t, g, 1, 2)
		g.Commit(nil)
		if _, err := g.Append("", "late"); !errors.Is(err, ErrEnded) {
			t.Errorf("Append after Commit: got %v; want ErrEnded", err)
		}
		if g.Commit(nil) {
			t.Error("second Commit: got stored true; want false")
		}
		s, err := g.Subscribe(1)
		if err != nil {
			t.Fatalf("Subscribe to an ended flight: got %v; want none", err)
		}
		p, ended := s.Read()
		if !ended {
			t.Error("Read: got ended=false; want true")
		}
		wiretest.CheckSeq(t, wiretest.ParseWire(t, p), g.Gen, 1, 2)
	})
}

func TestNonStreaming(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"chatcmpl-1","choices":[{"message":{"content":"hi"}}]}`)
	m := newMemory(t, Config{})

	t.Run("commit", func(t *testing.T) {
		sc := Scope{Tenant: "t", Key: "ok"}
		f := claim(t, m, sc, "fp")
		joiner := begin(t, m, sc, "fp").Flight
		head := Head{Status: 200, ContentType: "application/json"}
		f.SetHead(head)
		<-joiner.HeadReady()
		if h, ok := joiner.Head(); !ok || !reflect.DeepEqual(h, head) {
			t.Errorf("Head: got %+v, %v; want %+v, true", h, ok, head)
		}
		if !f.Commit(body) {
			t.Error("Commit: got stored false; want true")
		}
		<-joiner.Done()
		if st, _, got := joiner.Outcome(); st != StateCommitted || !bytes.Equal(got, body) {
			t.Errorf("Outcome: got %s %q; want %s %q", st, got, StateCommitted, body)
		}
		b := begin(t, m, sc, "fp")
		if b.Decision != Hit || b.Result == nil || !bytes.Equal(b.Result.Data, body) {
			t.Fatalf("Begin: got %v with result %+v; want hit with the body", b.Decision, b.Result)
		}
		if b.Result.Head.Stream || b.Result.Head.Status != 200 {
			t.Errorf("result head: got %+v; want %+v", b.Result.Head, head)
		}
		if got, err := b.Result.After(3); err != nil || !bytes.Equal(got, body) {
			t.Errorf("After(3): got %q, %v; want the body", got, err)
		}
		if ki, _ := m.Info(sc); ki.Bytes != len(body) || ki.Events != 0 {
			t.Errorf("Info: got %d bytes %d events; want %d 0", ki.Bytes, ki.Events, len(body))
		}
	})

	t.Run("fail with body", func(t *testing.T) {
		sc := Scope{Tenant: "t", Key: "bad"}
		f := claim(t, m, sc, "fp")
		errBody := []byte(`{"error":{"type":"invalid_request_error"}}`)
		f.SetHead(Head{Status: 400, ContentType: "application/json"})
		f.Fail(StateFailedTerminal, "upstream 400", errBody)
		st, reason, got := f.Outcome()
		if st != StateFailedTerminal || reason != "upstream 400" || !bytes.Equal(got, errBody) {
			t.Errorf("Outcome: got %s %q %q; want %s %q %q", st, reason, got, StateFailedTerminal, "upstream 400", errBody)
		}
		if ki, _ := m.Info(sc); ki.State != StateFailedTerminal || ki.Reason != "upstream 400" {
			t.Errorf("Info: got %s %q; want %s %q", ki.State, ki.Reason, StateFailedTerminal, "upstream 400")
		}
	})

	t.Run("fail before head", func(t *testing.T) {
		f := claim(t, m, Scope{Tenant: "t", Key: "nohead"}, "fp")
		f.Fail(StateCommitUnknown, "timeout", nil)
		select {
		case <-f.HeadReady():
		default:
			t.Fatal("HeadReady: got open; want closed after Fail")
		}
		if _, ok := f.Head(); ok {
			t.Error("Head: got ok=true; want false")
		}
		f.SetHead(Head{Status: 200}) // after the end: ignored, no panic
	})
}

// BenchmarkAppend journals one chat chunk per op into a keyed flight; a
// new generation starts every 4,096 events so the journal stays a
// realistic size.
func BenchmarkAppend(b *testing.B) {
	const per = 4096
	m := newMemory(b, Config{})
	var f *Flight
	b.ReportAllocs()
	b.SetBytes(int64(len(wiretest.ChatChunk)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%per == 0 {
			b.StopTimer()
			if f != nil {
				f.Fail(StateFailedRetryable, "bench", nil)
			}
			f = claim(b, m, Scope{Tenant: "t", Key: strconv.Itoa(i)}, "fp")
			f.SetHead(streamHead)
			b.StartTimer()
		}
		if _, err := f.Append("", wiretest.ChatChunk); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFanout has one producer append chat chunks while 64
// subscribers read them; one op is one event delivered to all 64.
func BenchmarkFanout(b *testing.B) {
	const subs, per = 64, 8192
	m := newMemory(b, Config{Limits: Limits{MaxSubscribers: subs}})
	b.ReportAllocs()
	b.SetBytes(int64(len(wiretest.ChatChunk)))
	b.ResetTimer()
	for n, round := 0, 0; n < b.N; round++ {
		f := claim(b, m, Scope{Tenant: "t", Key: strconv.Itoa(round)}, "fp")
		f.SetHead(streamHead)
		var wg sync.WaitGroup
		for range subs {
			s, err := f.Subscribe(0)
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				defer s.Close()
				for range s.C() {
					if _, ended := s.Read(); ended {
						return
					}
				}
			})
		}
		k := min(per, b.N-n)
		for range k {
			if _, err := f.Append("", wiretest.ChatChunk); err != nil {
				b.Fatal(err)
			}
		}
		n += k
		f.Fail(StateFailedRetryable, "bench", nil) // ends the followers without a store write
		wg.Wait()
	}
}
