package sse

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fuzz targets are with the tests of what they fuzz; this file keeps
// their committed seed corpus (testdata/fuzz) in step with testdata.

var updateCorpus = flag.Bool("update-corpus", false, "write the seed files generated from testdata into testdata/fuzz")

// requestSeeds are request bodies for FuzzParseRequest's committed corpus,
// shaped as the OpenAI and Anthropic SDKs send them.
var requestSeeds = map[string]string{
	"chat-usage":      `{"messages":[{"role":"user","content":"What is the capital of Mexico?"}],"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}`,
	"chat-n":          `{"model":"gpt-3.5-turbo","messages":[{"role":"system","content":"Be brief.\n"},{"role":"user","content":"Tell me a short joke"}],"n":2,"stream":true}`,
	"chat-nested":     `{"messages":[{"role":"user","content":"{\"stream\":true,\"n\":3}","name":"x","stream":true}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer"}}}}}],"model":"m"}`,
	"chat-escaped":    `{"str\u0065am":true,"\u006e":4,"stream_options":{"include\u005fusage":true},"model":"caf\u00e9"}`,
	"chat-duplicates": `{"stream":true,"n":2,"stream":false,"n":3,"stream_options":{"include_usage":true},"stream_options":null}`,
	"chat-image":      `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="}}]}],"stream":true}`,
	"responses":       `{"model":"gpt-4o-mini","instructions":"Be very concise.","input":"Count from 1 to 3, separated by commas.","stream":true}`,
	"anthropic":       `{"max_tokens":1024,"messages":[{"role":"user","content":"What is 1+1? Answer with just the number."}],"model":"claude-sonnet-4-5","stream":true}`,
	"malformed":       `{"stream":true,"stream_options":{"include_usage":true}`,
	"n-bounds":        `{"n":129,"model":null,"stream":1}`,
}

// scanCuts are the read sizes (less one) of FuzzScanner's seeds: a few
// that split lines and "\r\n" pairs, and reads larger than many events.
var scanCuts = []byte{0, 77, 255, 13, 1, 200}

// idSeeds are Last-Event-ID values for FuzzParseID's committed corpus: ids
// as the proxy writes them, and what clients send back wrong.
var idSeeds = map[string]string{
	"proxy":     "1764403200123-42",
	"zero":      "0-0",
	"max":       "18446744073709551615-18446744073709551615",
	"overflow":  "18446744073709551616-1",
	"leading-0": "01-1",
	"spaces":    " 1-2 ",
	"upstream":  "chatcmpl-B74aE2TDl9ZbKx2fXoVatoMDnErNm",
	"empty":     "",
}

// seedCorpus returns the seed files generated from testdata: the path
// under testdata/fuzz, and the contents in the go test fuzz v1 format. Each
// recorded stream seeds FuzzRead whole, FuzzScanner twice (scanCuts), and FuzzDetector with the request
// it answered (n=1; include_usage for openai-chat-usage), a chat stream
// also without its [DONE].
func seedCorpus(tb testing.TB) map[string]string {
	tb.Helper()
	files := map[string]string{}
	for _, name := range fixtureNames(tb) {
		body := fixture(tb, name)
		files["FuzzRead/"+name] = fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", body)
		// Whole, in reads of 1 to 256 bytes, under the default bound and
		// under one of 2 KiB with a cut end.
		files["FuzzScanner/"+name] = fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n[]byte(%q)\nuint16(0)\nbool(false)\n", body, scanCuts)
		files["FuzzScanner/"+name+"-bound"] = fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n[]byte(%q)\nuint16(2047)\nbool(true)\n", body, scanCuts)
		usage := name == "openai-chat-usage"
		files["FuzzDetector/"+name] = fmt.Sprintf("go test fuzz v1\nbyte(%q)\nbool(%v)\n[]byte(%q)\n", byte(1), usage, body)
		if cut, ok := strings.CutSuffix(body, "data: [DONE]\n\n"); ok {
			files["FuzzDetector/"+name+"-no-done"] = fmt.Sprintf("go test fuzz v1\nbyte(%q)\nbool(%v)\n[]byte(%q)\n", byte(1), usage, cut)
		}
	}
	for name, body := range requestSeeds {
		files["FuzzParseRequest/"+name] = fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", body)
	}
	for name, s := range idSeeds {
		files["FuzzParseID/"+name] = fmt.Sprintf("go test fuzz v1\nstring(%q)\n", s)
	}
	return files
}

// TestFuzzCorpus checks that the committed seed corpus holds every
// generated seed file as generated, so a new fixture cannot be forgotten;
// go test -run TestFuzzCorpus -update-corpus ./sse writes them. Other files
// there (crashers the fuzzer found) are left alone.
func TestFuzzCorpus(t *testing.T) {
	t.Parallel()
	for path, want := range seedCorpus(t) {
		full := filepath.Join("testdata", "fuzz", filepath.FromSlash(path))
		if *updateCorpus {
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(full)
		if err != nil {
			t.Errorf("%s: got %v; want the seed file (go test -run TestFuzzCorpus -update-corpus ./sse)", full, err)
			continue
		}
		if string(got) != want {
			t.Errorf("%s: got other contents; want the generated ones (go test -run TestFuzzCorpus -update-corpus ./sse)", full)
		}
	}
}
