package mockllm

import "hash/fnv"

// vocabulary is the fixed word list content is drawn from. Each entry is one
// token as a tokenizer would emit it (leading space, punctuation alone), and
// none needs JSON escaping, so tokens are appended to events as they are.
var vocabulary = [...]string{
	" the", " stream", " proxy", " token", " event", " model", " request",
	" client", " server", " cache", " key", " relay", " replay", " of",
	" and", " to", " a", " in", " is", " that", " it", " with", " for",
	" as", " on", " by", " this", " every", " once", " never", " again",
	" response", " gateway", " upstream", " idempotent", " retry", " budget",
	" journal", " subscriber", " resume", " id", " bytes", " flush", " chunk",
	" line", " data", " done", " clean", " end", ",", ".", " we", " you",
	" will", " can", " should", " must", " not", " be", " here", " there",
	" quickly", " safely", " LLM",
}

// padding fills content deltas up to X-Mock-Chunk-Bytes. It needs no JSON
// escaping either.
const padding = " lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor"

// rng is splitmix64: tiny, fast and fully determined by its seed, which is
// all the mock needs (math/rand/v2 would do too, but this keeps the exact
// output independent of the Go release).
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn returns a number in [0, n).
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// id returns prefix followed by n characters drawn from alphabet.
func (r *rng) id(prefix string, n int, alphabet string) string {
	b := make([]byte, len(prefix), len(prefix)+n)
	copy(b, prefix)
	for range n {
		b = append(b, alphabet[r.intn(len(alphabet))])
	}
	return string(b)
}

// completion is the dialect-independent part of one answer: its content
// tokens, ids, timestamp and usage, all derived from the request body.
type completion struct {
	model        string // request model, or the dialect's default
	created      int    // unix seconds, from the seed rather than the clock
	words        []uint8
	cut          bool // the request's token cap cut the answer short
	promptTokens int
	chunkBytes   int // pad content events to about this many bytes; 0: no padding
	overhead     int // bytes of a content event besides its text, for padding
	r            rng // the rest of the seeded stream, for dialect ids
}

// newCompletion derives an answer from the request body. tokens is the
// answer's length before maxTokens (0: no cap) applies.
func newCompletion(body []byte, model string, tokens, maxTokens, chunkBytes int) *completion {
	h := fnv.New64a()
	_, _ = h.Write(body)
	c := &completion{
		model:        model,
		promptTokens: len(body)/4 + 1, // a rough tokenizer: four bytes a token
		chunkBytes:   chunkBytes,
		r:            rng{s: h.Sum64()},
	}
	c.created = 1_700_000_000 + c.r.intn(100_000_000)
	if maxTokens > 0 && maxTokens < tokens {
		tokens, c.cut = maxTokens, true
	}
	c.words = make([]uint8, tokens)
	for i := range c.words {
		c.words[i] = uint8(c.r.intn(len(vocabulary)))
	}
	return c
}

// appendToken appends the text of content token i, padded when asked.
func (c *completion) appendToken(dst []byte, i int) []byte {
	w := vocabulary[c.words[i]]
	if i == 0 && w[0] == ' ' {
		w = w[1:] // an answer does not start with a space
	}
	dst = append(dst, w...)
	if c.chunkBytes > 0 {
		for pad := c.chunkBytes - c.overhead - len(w); pad > 0; {
			n := min(pad, len(padding))
			dst = append(dst, padding[:n]...)
			pad -= n
		}
	}
	return dst
}

// appendText appends the whole answer, as the concatenation of its tokens.
func (c *completion) appendText(dst []byte) []byte {
	for i := range c.words {
		dst = c.appendToken(dst, i)
	}
	return dst
}

// text returns the whole answer.
func (c *completion) text() string { return string(c.appendText(nil)) }
