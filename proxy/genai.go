package proxy

import (
	"bytes"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/ssegate/ssegate/cache"
)

// The OpenTelemetry GenAI semantic conventions' metrics, as Prometheus
// histograms under the names the OpenTelemetry-to-Prometheus mapping gives
// them (dots to underscores, the unit "s" as _seconds, a {token}
// annotation dropped), with the buckets the conventions advise. Their
// labels are the conventions' attributes, mapped the same way, each from
// a fixed set; the request's model only up to -metrics-models of them.
type genAIMetrics struct {
	tokens   *prometheus.HistogramVec // gen_ai_client_token_usage
	duration *prometheus.HistogramVec // gen_ai_server_request_duration_seconds
	ttft     *prometheus.HistogramVec // gen_ai_server_time_to_first_token_seconds
	tpot     *prometheus.HistogramVec // gen_ai_server_time_per_output_token_seconds
	models   modelLabels
}

// The conventions' advised bucket boundaries.
var (
	genAITokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	genAIDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genAITTFTBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}
	genAITPOTBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
)

// The conventions' attributes, as Prometheus labels.
const (
	labelOperation = "gen_ai_operation_name"
	labelProvider  = "gen_ai_provider_name"
	labelModel     = "gen_ai_request_model"
	labelTokenType = "gen_ai_token_type"
	labelErrorType = "error_type"
)

func newGenAIMetrics(reg *prometheus.Registry, models int) *genAIMetrics {
	h := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets},
			append([]string{labelOperation, labelProvider, labelModel}, labels...))
		reg.MustRegister(v)
		return v
	}
	return &genAIMetrics{
		tokens: h("gen_ai_client_token_usage", "Tokens the upstream reported for each generation that reported them (OpenTelemetry gen_ai.client.token.usage), by gen_ai_token_type: input or output.",
			genAITokenBuckets, labelTokenType),
		duration: h("gen_ai_server_request_duration_seconds", "Time from a generation's request to its end, over every upstream call it made (OpenTelemetry gen_ai.server.request.duration); error_type names the cause of an end without a whole answer.",
			genAIDurationBuckets, labelErrorType),
		ttft: h("gen_ai_server_time_to_first_token_seconds", "Time from a generation's request to its first output relayed (OpenTelemetry gen_ai.server.time_to_first_token).",
			genAITTFTBuckets),
		tpot: h("gen_ai_server_time_per_output_token_seconds", "Time per output token after the first, of generations that ended whole and reported more than one (OpenTelemetry gen_ai.server.time_per_output_token).",
			genAITPOTBuckets),
		models: modelLabels{max: models, seen: map[string]struct{}{}},
	}
}

// otherModel is the label of a model past -metrics-models, or one that is
// no fit label value.
const otherModel = "other"

// maxModelLabel bounds the length of a model's label.
const maxModelLabel = 128

// modelLabels hands out the request's model as a label value, for the
// first max distinct models seen; every later one is otherModel.
type modelLabels struct {
	max  int
	mu   sync.Mutex // guards seen
	seen map[string]struct{}
}

func (l *modelLabels) label(model string) string {
	if model == "" || len(model) > maxModelLabel || !utf8.ValidString(model) {
		return otherModel
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[model]; ok {
		return model
	}
	if len(l.seen) >= l.max {
		return otherModel
	}
	l.seen[model] = struct{}{}
	return model
}

// genAIOp is what the conventions know of one generation: its
// operation, its provider and its model's label.
type genAIOp struct {
	operation, provider, model string
}

// newGenAIOp names the generation of a request to path for model.
func (m *genAIMetrics) op(path []byte, model string) genAIOp {
	o := genAIOp{operation: "chat", provider: "openai", model: m.models.label(model)}
	switch {
	case bytes.HasSuffix(path, []byte("/messages")):
		o.provider = "anthropic"
	case bytes.HasSuffix(path, []byte("/chat/completions")), bytes.HasSuffix(path, []byte("/responses")):
	case bytes.HasSuffix(path, []byte("/completions")):
		o.operation = "text_completion"
	case bytes.HasSuffix(path, []byte("/embeddings")):
		o.operation = "embeddings"
	}
	return o
}

// usage observes the tokens a generation's upstream reported.
func (m *genAIMetrics) usage(o genAIOp, input, output int64) {
	m.tokens.WithLabelValues(o.operation, o.provider, o.model, "input").Observe(float64(input))
	m.tokens.WithLabelValues(o.operation, o.provider, o.model, "output").Observe(float64(output))
}

// ended observes a generation's end: its duration since start, with
// errType the cause of an end without a whole answer ("" for none), and
// its time per output token after first (zero: no output relayed).
func (m *genAIMetrics) ended(o genAIOp, start, first time.Time, errType string, output int64) {
	now := time.Now()
	m.duration.WithLabelValues(o.operation, o.provider, o.model, errType).Observe(now.Sub(start).Seconds())
	if errType == "" && output > 1 && !first.IsZero() {
		m.tpot.WithLabelValues(o.operation, o.provider, o.model).Observe(now.Sub(first).Seconds() / float64(output-1))
	}
}

// firstToken observes a generation's time to its first output.
func (m *genAIMetrics) firstToken(o genAIOp, start time.Time) {
	m.ttft.WithLabelValues(o.operation, o.provider, o.model).Observe(time.Since(start).Seconds())
}

// errorType is the error.type of an end for c: the upstream's status for
// its own error answer, as OpenTelemetry's HTTP conventions name it, or
// the cause's name.
func errorType(c cause, status int) string {
	if causes[c].byStatus && status != 0 {
		return strconv.Itoa(status)
	}
	return causes[c].name
}

// end observes g's end; errType is the cause of an end without a whole
// answer ("" for none).
func (m *genAIMetrics) end(g *gen, errType string) {
	f := g.f
	u := f.Usage()
	if errType == "" && u != (cache.Usage{}) {
		m.usage(g.ai, u.Input, u.Output)
	}
	m.ended(g.ai, g.start, f.FirstEventAt(), errType, u.Output)
}
