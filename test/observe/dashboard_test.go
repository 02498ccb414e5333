package observe_test

import (
	"encoding/json"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssegate/ssegate/internal/poll"
	"github.com/ssegate/ssegate/internal/redistest"
)

// mayBeEmpty names the dashboard's queries (panel title, then legend)
// that may have no data after the load, and why.
var mayBeEmpty = map[string]string{}

// TestDashboardAndRules runs a real Prometheus, with the shipped rules,
// scraping two built ssegates (one in-memory, one on Redis) under a short
// load, and evaluates every query of the shipped dashboard and every rule
// through Prometheus's HTTP API: none may fail, and none may be empty
// where the load made data. It also checks that every input series of the
// rules' unit tests has the name and labels of a series ssegate exports.
func TestDashboardAndRules(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	memory := gates.Start(t, mockFlags...)
	shared := gates.Start(t, append([]string{"-redis", "redis://" + redis.Addr + "/0"}, mockFlags...)...)
	pr := startPrometheus(t, abs(t, rulesFile), map[string]string{"ssegate": memory.Addr, "ssegate-redis": shared.Addr})

	// The load twice, with a scrape between: a series born in the first
	// round (a model's histogram, a reason's first retry) has a sample
	// before the second, so rate() sees the second whole, as it sees a
	// long-running ssegate's.
	for _, round := range []string{"first", "second"} {
		waitScraped(t, pr, time.Now())
		runLoad(t, memory.URL, "memory-"+round)
		runLoad(t, shared.URL, "redis-"+round)
	}
	loaded := time.Now()
	waitScraped(t, pr, loaded)
	poll.For(t, 30*time.Second, "every rule evaluated after the load", func() bool {
		rs, err := pr.rules()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.LastEvaluation.Before(loaded.Add(scrapeInterval)) {
				return false
			}
		}
		return len(rs) > 0
	})

	t.Run("dashboard", func(t *testing.T) { checkDashboard(t, pr) })
	t.Run("rules", func(t *testing.T) { checkRules(t, pr) })
	t.Run("rule test series", func(t *testing.T) { checkRuleTestSeries(t, pr) })
	t.Run("values", func(t *testing.T) { checkValues(t, pr) })
}

// checkValues: what the load made is what the recording rules say, per
// job: the keys left commit_unknown by each round's 504 (the Redis
// replica's count is Redis's, taken once), and some key reuse.
func checkValues(t *testing.T, pr *prom) {
	for expr, want := range map[string]func(float64) bool{
		"job:ssegate_commit_unknown_keys:sum":      func(v float64) bool { return v == 2 },
		"job:ssegate_key_reuse:ratio_rate5m":       func(v float64) bool { return v > 0 && v < 1 },
		"job:ssegate_streams_aborted:ratio_rate5m": func(v float64) bool { return v > 0 && v < 1 },
	} {
		s, err := pr.query(expr)
		if err != nil {
			t.Fatal(err)
		}
		jobs := map[string]bool{}
		for _, x := range s {
			v, ok := value(x)
			jobs[x.Metric["job"]] = true
			if !ok || !want(v) {
				t.Errorf("%s{job=%q}: got %v", expr, x.Metric["job"], x.Value[1])
			}
		}
		if !jobs["ssegate"] || !jobs["ssegate-redis"] {
			t.Errorf("%s: got the jobs %v; want ssegate and ssegate-redis", expr, jobs)
		}
	}
}

// waitScraped waits until Prometheus holds a scrape of every target taken
// after at.
func waitScraped(t *testing.T, pr *prom, at time.Time) {
	t.Helper()
	poll.For(t, 30*time.Second, "a scrape of every target", func() bool {
		s, err := pr.query(`timestamp(up == 1)`)
		if err != nil {
			t.Fatal(err)
		}
		if len(s) < 2 {
			return false
		}
		for _, x := range s {
			if v, ok := value(x); !ok || v < float64(at.UnixMilli())/1000 {
				return false
			}
		}
		return true
	})
}

// value is a sample's value; ok is false for NaN and what does not parse.
func value(s sample) (float64, bool) {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	return v, err == nil && !math.IsNaN(v)
}

// panel is what the test reads of a Grafana panel.
type panel struct {
	ID         int               `json:"id"`
	Type       string            `json:"type"`
	Title      string            `json:"title"`
	Datasource map[string]string `json:"datasource"`
	Targets    []struct {
		Expr       string            `json:"expr"`
		Legend     string            `json:"legendFormat"`
		Datasource map[string]string `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// variable is what the test reads of a dashboard variable.
type variable struct {
	Name, Type string
	Query      json.RawMessage // a string or, for a query variable, an object
}

// grafanaVars are the values the test gives the dashboard's variables: all
// jobs, and a rate window that holds several scrapes of the load.
var grafanaVars = strings.NewReplacer(`"$job"`, `".+"`, "$__rate_interval", "1m")

// checkDashboard: the dashboard is importable as is (its data source is
// a variable, no UID is hard-coded), and each of its queries evaluates
// without error to data.
func checkDashboard(t *testing.T, pr *prom) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string  `json:"uid"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []variable `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID != "" {
		t.Errorf("the dashboard has uid %q: leave it to the Grafana it is imported into", d.UID)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v variable) bool {
		return v.Name == "datasource" && v.Type == "datasource" && string(v.Query) == `"prometheus"`
	}) {
		t.Error("the dashboard has no datasource variable of type prometheus")
	}
	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	ids, queries := map[int]bool{}, 0
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d is not unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if uid := p.Datasource["uid"]; uid != "${datasource}" {
			t.Errorf("panel %q: data source %q; want ${datasource}", p.Title, uid)
		}
		for _, tg := range p.Targets {
			queries++
			name := p.Title + ", " + tg.Legend
			if uid := tg.Datasource["uid"]; uid != "${datasource}" {
				t.Errorf("%s: data source %q; want ${datasource}", name, uid)
			}
			expr := grafanaVars.Replace(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("%s: a variable the test does not know: %s", name, expr)
				continue
			}
			checkQuery(t, pr, name, expr, mayBeEmpty[name])
		}
	}
	t.Logf("%d panels, %d queries", len(ids), queries)
}

// checkQuery evaluates expr and fails on an error, or on no data (no
// sample, or only NaN) unless why says why it may have none.
func checkQuery(t *testing.T, pr *prom, name, expr, why string) {
	t.Helper()
	s, err := pr.query(expr)
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	if why != "" {
		return
	}
	if !slices.ContainsFunc(s, func(x sample) bool { _, ok := value(x); return ok }) {
		t.Errorf("%s: no data after the load: %s gave %v", name, expr, s)
	}
}

// referenced finds the series and recorded series a rule reads.
var referenced = regexp.MustCompile(`\b(?:ssegate_[a-z_]+|(?:job|instance):[a-z_:0-9]+)`)

// checkRules: Prometheus loaded every shipped rule and evaluates each
// without error; a recording rule's expression has data after the load,
// and so has every series an alert reads (an alert's own expression is
// empty while it does not fire; promtool's unit tests show when it does).
func checkRules(t *testing.T, pr *prom) {
	rs, err := pr.rules()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := regexp.MustCompile(`(?m)^\s*- (record|alert): `).FindAll(raw, -1); len(rs) != len(want) {
		t.Errorf("prometheus loaded %d rules; the file has %d", len(rs), len(want))
	}
	for _, r := range rs {
		if r.Health != "ok" || r.LastError != "" {
			t.Errorf("rule %s: health %q, last error %q", r.Name, r.Health, r.LastError)
		}
		if r.Type == "recording" {
			checkQuery(t, pr, "rule "+r.Name, r.Query, "")
			continue
		}
		if _, err := pr.query(r.Query); err != nil {
			t.Errorf("alert %s: %v", r.Name, err)
		}
		for _, name := range referenced.FindAllString(r.Query, -1) {
			checkQuery(t, pr, "alert "+r.Name+" reads "+name, name, "")
		}
	}
}

// checkRuleTestSeries: every input series of the rules' unit tests is one
// ssegate exports, by name and labels (job and instance are the scrape's,
// and upstream names whatever -upstream said).
func checkRuleTestSeries(t *testing.T, pr *prom) {
	raw, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`series: '([a-z_:]+)\{([^}]*)\}'`)
	label := regexp.MustCompile(`([a-z_]+)="([^"]*)"`)
	seen := map[string]bool{}
	for _, m := range line.FindAllStringSubmatch(string(raw), -1) {
		name, want := m[1], map[string]string{}
		for _, l := range label.FindAllStringSubmatch(m[2], -1) {
			switch l[1] {
			case "job", "instance":
			case "upstream":
				want[l[1]] = "*"
			default:
				want[l[1]] = l[2]
			}
		}
		key := m[0]
		if seen[key] {
			continue
		}
		seen[key] = true
		got, err := pr.series(`{__name__="` + name + `"}`)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !slices.ContainsFunc(got, func(ls map[string]string) bool { return sameLabels(ls, want) }) {
			t.Errorf("the rules' test series %s{%s} is no series ssegate exports; those named %s: %v", name, m[2], name, got)
		}
	}
	if len(seen) == 0 {
		t.Fatalf("no input series found in %s", rulesTestFile)
	}
}

// sameLabels reports whether the scraped label set got has exactly the
// labels of want, besides __name__, job and instance; "*" matches any value.
func sameLabels(got, want map[string]string) bool {
	n := 0
	for k, v := range got {
		switch k {
		case "__name__", "job", "instance":
			continue
		}
		n++
		if w, ok := want[k]; !ok || (w != "*" && w != v) {
			return false
		}
	}
	return n == len(want)
}
