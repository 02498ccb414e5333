package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"

	"github.com/valyala/fasthttp"
)

// TestReadBody holds readBody to io.ReadAll under the limit: bodies of
// every size around its buffer's, with their length in the head, without
// it, and with a head that says less or more than comes; read whole or a
// byte a read.
func TestReadBody(t *testing.T) {
	for _, size := range []int{0, 1, 511, 512, 513, 4096, 70_000} {
		for _, said := range []int{size, -1, size / 2, size + 7} {
			for _, limit := range []int{size - 1, size, size + 1, 100_000} {
				for _, slow := range []bool{false, true} {
					if limit < 0 {
						continue
					}
					name := fmt.Sprintf("size=%d/said=%d/limit=%d/slow=%v", size, said, limit, slow)
					want := bytes.Repeat([]byte("abcdefghij"), size/10+1)[:size]
					resp := fasthttp.AcquireResponse()
					var r io.Reader = bytes.NewReader(want)
					if slow {
						r = iotest.OneByteReader(r)
					}
					resp.SetBodyStream(r, -1)
					resp.Header.SetContentLength(said)
					got, err := readBody(resp, limit)
					fasthttp.ReleaseResponse(resp)
					switch {
					case size > limit:
						if !errors.Is(err, errBodyTooLarge) {
							t.Errorf("%s: %d bytes, %v; want errBodyTooLarge", name, len(got), err)
						}
					case err != nil || !bytes.Equal(got, want):
						t.Errorf("%s: %d bytes, %v; want the %d bytes", name, len(got), err, size)
					}
				}
			}
		}
	}
}

// TestReadBodyError: a read error other than the end is readBody's.
func TestReadBodyError(t *testing.T) {
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	boom := errors.New("reset")
	resp.SetBodyStream(io.MultiReader(bytes.NewReader([]byte("partial")), iotest.ErrReader(boom)), -1)
	resp.Header.SetContentLength(100)
	if _, err := readBody(resp, 1000); !errors.Is(err, boom) {
		t.Fatalf("err %v, want %v", err, boom)
	}
}
