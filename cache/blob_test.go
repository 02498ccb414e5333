package cache

import (
	"bytes"
	"encoding/binary"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/ssegate/ssegate/sse"
)

func TestBlobRoundTrip(t *testing.T) {
	t.Parallel()
	c, err := NewCodec(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := newMemory(t, Config{})
	f := claim(t, m, Scope{Tenant: "t", Key: "k"}, "fp")
	f.SetHead(Head{Status: 200, Stream: true, ContentType: "text/event-stream", Header: []Header{{"A", "b"}}})
	appendN(t, f, 1, 100)
	f.Commit(nil)
	_, res, _ := m.Attach(Scope{Tenant: "t", Key: "k"}, "", sse.ID{}, false)
	b, err := c.Encode(res)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Decode(b, res.Scope)
	if err != nil {
		t.Fatal(err)
	}
	if got.Gen != res.Gen || !bytes.Equal(got.Data, res.Data) || len(got.Ends) != len(res.Ends) || got.Ends[99] != res.Ends[99] || got.Head.Header[0] != res.Head.Header[0] {
		t.Fatal("decoded result differs from the encoded one")
	}
	if len(b) >= len(res.Data) {
		t.Fatalf("blob: %d bytes for %d of events; want compression", len(b), len(res.Data))
	}
	if _, err := c.Decode(b[:len(b)/2], res.Scope); err == nil {
		t.Fatal("truncated blob: got no error")
	}
	// S2 blocks carry no checksum; the blob does: a damaged byte anywhere
	// in its frames is refused, not replayed.
	for _, at := range []int{len(b) - 1, len(b) / 2, len(b) - 40} {
		bad := append([]byte(nil), b...)
		bad[at] ^= 0x20
		if _, err := c.Decode(bad, res.Scope); err == nil {
			t.Fatalf("blob damaged at byte %d of %d: got no error", at, len(b))
		}
	}
	// Blobs kept by earlier versions (zstd: one frame with no length, or
	// frames after the length) still read, since Redis may hold results
	// written before an upgrade.
	meta, err := c.meta(res)
	if err != nil {
		t.Fatal(err)
	}
	raw := append(meta, got.Data...)
	z, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	v1 := z.EncodeAll(raw, append([]byte(nil), blobMagicV1...))
	v2 := z.EncodeAll(raw, binary.AppendUvarint(append([]byte(nil), blobMagicV2...), uint64(len(raw))))
	z.Close()
	for v, blob := range [][]byte{v1, v2} {
		if got, err := c.Decode(blob, res.Scope); err != nil || !bytes.Equal(got.Data, res.Data) || got.Events() != 100 {
			t.Fatalf("version %d blob: %v; want the same result", v+1, err)
		}
	}
	// A length beyond the bound is refused before anything is allocated,
	// and so is a frame that would decode past the length given.
	rest := b[len(blobMagic)+uvarintLen(b[len(blobMagic):]):]
	huge := binary.AppendUvarint(append([]byte(nil), blobMagic...), 1<<40)
	if _, err := c.Decode(append(huge, rest...), res.Scope); err == nil {
		t.Fatal("blob claiming 1 TiB: got no error")
	}
	short := binary.AppendUvarint(append([]byte(nil), blobMagic...), 10)
	if _, err := c.Decode(append(short, rest...), res.Scope); err == nil {
		t.Fatal("blob whose frames pass its length: got no error")
	}
}

func uvarintLen(b []byte) int {
	_, n := binary.Uvarint(b)
	return n
}

// maxStoredRatio bounds a committed blob's size against the raw bytes of
// the journal it was committed from.
const maxStoredRatio = 0.35

// TestStoredRatioFixtures journals each recorded stream of sse/testdata
// (the whole set one after the other, as a longer stream, too) with one
// subscriber that keeps up, commits it, and holds the stored blob to
// maxStoredRatio of the raw bytes. A stream of under 4 KiB is only
// logged: the head and the blob's framing weigh more than its events.
func TestStoredRatioFixtures(t *testing.T) {
	names, err := filepath.Glob(filepath.Join("..", "sse", "testdata", "*.sse"))
	if err != nil || len(names) == 0 {
		t.Fatalf("fixtures: %v (%d found)", err, len(names))
	}
	var all []sse.Event
	streams := map[string][]sse.Event{}
	for _, name := range names {
		body, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for ev, err := range sse.Read(strings.NewReader(string(body)), 0) {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			streams[filepath.Base(name)] = append(streams[filepath.Base(name)], ev)
		}
		all = append(all, streams[filepath.Base(name)]...)
	}
	var long []sse.Event
	for range 20 {
		long = append(long, all...)
	}
	streams["all×20"] = long
	m := newMemory(t, Config{})
	for _, name := range slices.Sorted(maps.Keys(streams)) {
		evs := streams[name]
		sc := Scope{Tenant: "t", Key: name}
		f := claim(t, m, sc, "fp")
		f.SetHead(streamHead)
		s, err := f.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if _, err := f.Append(ev.Type, ev.Data); err != nil {
				t.Fatal(err)
			}
			s.Read()
		}
		s.Close()
		if !f.Commit(nil) {
			t.Fatalf("%s: the body store did not keep the result", name)
		}
		b, ok := m.bodies.Get(sc.ID())
		if !ok {
			t.Fatalf("%s: no blob", name)
		}
		raw := begin(t, m, sc, "fp").Result.dataSize()
		ratio := float64(len(b.z)) / float64(raw)
		t.Logf("%s: %d events, %d raw bytes, %d stored: %.3f", name, len(evs), raw, len(b.z), ratio)
		if raw >= 4<<10 && ratio > maxStoredRatio {
			t.Errorf("%s: stored %.3f of the raw bytes; want at most %.2f", name, ratio, maxStoredRatio)
		}
	}
}

// TestAppendBlock: a block compressed in place (appendBlock) is the frame
// of the block compressed on its own, for every size around the s2
// encoder's own bounds, into any room: enough, too little (it falls back
// to a buffer of its own), and none.
func TestAppendBlock(t *testing.T) {
	t.Parallel()
	src := []byte(strings.Repeat(`data: {"choices":[{"delta":{"content":"tok"}}]}`+"\n\n", 2000))
	for i := range src {
		if i%7 == 0 {
			src[i] = byte(i) // not all of it repeats
		}
	}
	for _, n := range []int{1, 2, 16, 17, 100, 909, 4096, 65535, 65536, 65537, len(src)} {
		block := src[:n]
		want := appendFrame([]byte("prefix"), s2.Encode(nil, block))
		for _, room := range []int{0, binary.MaxVarintLen64 + s2.MaxEncodedLen(n) - 1, binary.MaxVarintLen64 + s2.MaxEncodedLen(n), 2 * n} {
			out := append(make([]byte, 0, len("prefix")+room), "prefix"...)
			if got := appendBlock(out, block); !bytes.Equal(got, want) {
				t.Fatalf("%d bytes into room for %d: the frame differs from the block compressed on its own", n, room)
			}
		}
	}
}
