package observe_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/gatetest"
	"github.com/ssegate/ssegate/internal/poll"
)

// scrapeInterval is short so that a few seconds of load give every rate
// the two samples it needs.
const scrapeInterval = time.Second

// prom is a Prometheus server of the test's own, with the shipped rules.
type prom struct {
	url string
	p   *process
}

// startPrometheus runs Debian's prometheus on a free loopback port with a
// config that scrapes each job's target (host:port, /metrics) every
// scrapeInterval, evaluates rules as often, and keeps its data in a
// temporary directory. It waits until Prometheus is ready.
func startPrometheus(t *testing.T, rules string, jobs map[string]string) *prom {
	t.Helper()
	bin := program(t, "prometheus", "prometheus")
	dir := t.TempDir()
	var conf strings.Builder
	fmt.Fprintf(&conf, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\nrule_files:\n  - %q\nscrape_configs:\n", scrapeInterval, scrapeInterval, rules)
	for job, target := range jobs {
		fmt.Fprintf(&conf, "  - job_name: %q\n    static_configs:\n      - targets: [%q]\n", job, target)
	}
	confFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confFile, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := gatetest.FreePort(t)
	p := start(t, "prometheus", exec.Command(bin, "--config.file="+confFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn"))
	pr := &prom{url: "http://" + addr, p: p}
	poll.For(t, 30*time.Second, "prometheus ready", func() bool {
		if p.exited() {
			t.Fatalf("prometheus exited:\n%s", p.logs.String())
		}
		resp, err := http.Get(pr.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return pr
}

// api GETs a Prometheus HTTP API path and decodes its data into v; an
// answer that is not "success" is an error carrying Prometheus's words.
func (pr *prom) api(path string, q url.Values, v any) error {
	resp, err := http.Get(pr.url + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: %d, %v", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return json.Unmarshal(r.Data, v)
}

// sample is one element of an instant vector.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now and returns its samples (a scalar is one
// sample without labels).
func (pr *prom) query(expr string) ([]sample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := pr.api("/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		return nil, err
	}
	switch d.ResultType {
	case "vector":
		var s []sample
		return s, json.Unmarshal(d.Result, &s)
	case "scalar":
		var v [2]any
		return []sample{{Value: v}}, json.Unmarshal(d.Result, &v)
	}
	return nil, fmt.Errorf("%s: result of type %s, not an instant vector", expr, d.ResultType)
}

// series returns the label sets of the series that match selector.
func (pr *prom) series(selector string) ([]map[string]string, error) {
	var d []map[string]string
	err := pr.api("/api/v1/series", url.Values{"match[]": {selector}, "start": {fmt.Sprint(time.Now().Add(-time.Hour).Unix())}}, &d)
	return d, err
}

// rule is one loaded rule as /api/v1/rules gives it.
type rule struct {
	Name           string    `json:"name"`
	Query          string    `json:"query"`
	Type           string    `json:"type"` // recording or alerting
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

// rules returns the rules Prometheus loaded, in their files' order.
func (pr *prom) rules() ([]rule, error) {
	var d struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := pr.api("/api/v1/rules", nil, &d); err != nil {
		return nil, err
	}
	var rs []rule
	for _, g := range d.Groups {
		rs = append(rs, g.Rules...)
	}
	return rs, nil
}
