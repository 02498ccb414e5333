package proxy

import (
	"testing"

	"github.com/ssegate/ssegate/cache"
	"github.com/ssegate/ssegate/sse"
)

// TestToolCallerEvents: a caller's copy of a tool call's journal, read
// with sse.Scanner and written with sse.AppendEvent: without the
// journal's ids, each message under the caller's own id and progress
// token; a joiner gets no request of the server's and no progress it
// did not ask for; the stream of a call that did not end with its
// response ends with the outcome-unknown error.
func TestToolCallerEvents(t *testing.T) {
	t.Parallel()
	var wire []byte
	for i, data := range []string{
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"o","progress":1}}`,
		`{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}`,
		"{\"jsonrpc\":\"2.0\",\n\"method\":\"notifications/message\",\"params\":{}}", // two data lines
		`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`,
	} {
		wire = sse.AppendEvent(wire, sse.ID{Gen: 9, Seq: uint64(i + 1)}, "message", data)
	}
	for _, c := range []struct {
		name string
		tc   *toolCaller
		want string
	}{
		{"origin", &toolCaller{id: []byte("1"), token: []byte(`"o"`), origin: true},
			"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"o\",\"progress\":1}}\n\n" +
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"sampling/createMessage\",\"params\":{}}\n\n" +
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"method\":\"notifications/message\",\"params\":{}}\n\n" +
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n"},
		{"joiner with progress", &toolCaller{id: []byte(`"j"`), token: []byte("5")},
			"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":5,\"progress\":1}}\n\n" +
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"method\":\"notifications/message\",\"params\":{}}\n\n" +
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"j\",\"result\":{\"content\":[]}}\n\n"},
		{"joiner without progress", &toolCaller{id: []byte("2")},
			"event: message\ndata: {\"jsonrpc\":\"2.0\",\ndata: \"method\":\"notifications/message\",\"params\":{}}\n\n" +
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[]}}\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := string(c.tc.events(nil, wire)); got != c.want {
				t.Fatalf("got\n%q; want\n%q", got, c.want)
			}
			if got := c.tc.end(nil, cache.StateCommitted, ""); len(got) != 0 {
				t.Fatalf("end of a committed call: got %q; want nothing", got)
			}
			if got := c.tc.end(nil, cache.StateFailedTerminal, causeErrorEvent.String()); len(got) != 0 {
				t.Fatalf("end after the server's error: got %q; want nothing", got)
			}
			want := string(sse.AppendEvent(nil, sse.ID{}, "message", string(unknownMessage(c.tc.id))))
			if got := string(c.tc.end(nil, cache.StateCommitUnknown, "upstream_read_error")); got != want {
				t.Fatalf("end of a cut call: got %q; want %q", got, want)
			}
		})
	}
}
