//go:build !race

package cache

import (
	"runtime"
	"strconv"
	"testing"
)

// TestLiveStreamMemory holds 512 live keyed streams, each followed by its
// client and 150 events in, and bounds the heap each holds: the open
// block, the sealed ones packed (the streams together pass
// SealLiveBytes), the event ends and the flight. Not parallel: the
// process's heap is measured.
func TestLiveStreamMemory(t *testing.T) {
	const streams, events = 512, 150
	data := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"token"},"finish_reason":null}]}`
	m := newMemory(t, Config{})
	runtime.GC()
	runtime.GC() // the pools' blocks outlive one
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fs := make([]*Flight, streams)
	subs := make([]*Sub, streams)
	for i := range fs {
		fs[i] = claim(t, m, Scope{Tenant: "t", Key: strconv.Itoa(i)}, "fp")
		fs[i].SetHead(streamHead)
		subs[i], _ = fs[i].Subscribe(0)
	}
	for range events {
		for i, f := range fs {
			if _, err := f.Append("", data); err != nil {
				t.Fatal(err)
			}
			for p, _ := subs[i].Read(); len(p) > 0; p, _ = subs[i].Read() {
			}
		}
	}
	runtime.GC()
	runtime.GC() // the pools' blocks outlive one
	runtime.ReadMemStats(&after)
	perStream := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / streams / 1024
	var raw, packed, ends int
	for _, f := range fs {
		for i, b := range f.j.blocks {
			raw += cap(b)
			packed += len(f.j.packed[i])
		}
		raw += len(f.j.retired) * journalBlock
		ends += cap(f.j.ends) * 4
	}
	t.Logf("%.1f KiB of heap per live stream: journal blocks %d B raw, %d packed, event ends %d", perStream, raw/streams, packed/streams, ends/streams)
	if perStream > 12 {
		t.Errorf("%.1f KiB of heap per live stream; want at most 12", perStream)
	}
	runtime.KeepAlive(fs)
	runtime.KeepAlive(subs)
}
