package cache

import (
	"bytes"
	"encoding/binary"
	"testing"

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
