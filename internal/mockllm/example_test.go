package mockllm_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ssegate/ssegate/internal/mockllm"
)

// Example streams a chat completion from a mock on loopback and prints its
// first two and last two events. The output is the same on every run.
func Example() {
	s := mockllm.New(mockllm.Config{Tokens: 4})
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer s.Close()

	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	evs := strings.SplitAfter(string(b), "\n\n")
	evs = evs[:len(evs)-1]
	for _, ev := range append(evs[:2], evs[len(evs)-2:]...) {
		fmt.Print(ev)
	}
	fmt.Println(s.Calls(), "call")
	// Output:
	// data: {"id":"chatcmpl-Cbx0jkVDbKOU","object":"chat.completion.chunk","created":1718437681,"model":"gpt-4o-mini","system_fingerprint":"fp_37d6c3321d","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}
	//
	// data: {"id":"chatcmpl-Cbx0jkVDbKOU","object":"chat.completion.chunk","created":1718437681,"model":"gpt-4o-mini","system_fingerprint":"fp_37d6c3321d","choices":[{"index":0,"delta":{"content":"we"},"logprobs":null,"finish_reason":null}]}
	//
	// data: {"id":"chatcmpl-Cbx0jkVDbKOU","object":"chat.completion.chunk","created":1718437681,"model":"gpt-4o-mini","system_fingerprint":"fp_37d6c3321d","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}
	//
	// data: [DONE]
	//
	// 1 call
}
