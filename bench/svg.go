package main

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strconv"
	"strings"
)

// series is one line of the chart: a path's median events/s at each
// concurrency.
type series struct {
	name string
	x, y []float64
}

// sweepSeries returns the sweep's series, one per path, in the order the
// paths were measured.
func (rep *report) sweepSeries() []series {
	var out []series
	idx := map[string]int{}
	for _, a := range rep.rows("sweep", evps) {
		c, err := strconv.Atoi(strings.TrimPrefix(a.step, "c="))
		y := a.med(evps)
		if err != nil || math.IsNaN(y) {
			continue
		}
		i, ok := idx[a.path]
		if !ok {
			i = len(out)
			idx[a.path] = i
			out = append(out, series{name: a.path})
		}
		out[i].x = append(out[i].x, float64(c))
		out[i].y = append(out[i].y, y)
	}
	for _, s := range out {
		sort.Sort(byX(s))
	}
	return out
}

type byX series

func (s byX) Len() int           { return len(s.x) }
func (s byX) Less(i, j int) bool { return s.x[i] < s.x[j] }
func (s byX) Swap(i, j int) {
	s.x[i], s.x[j] = s.x[j], s.x[i]
	s.y[i], s.y[j] = s.y[j], s.y[i]
}

// palette colours the series; dashes tell them apart without colour.
var palette = []struct{ color, dash string }{
	{"#444444", ""}, {"#1f77b4", "6 3"}, {"#2ca02c", "2 3"}, {"#ff7f0e", ""}, {"#d62728", "8 3 2 3"},
	{"#9467bd", "4 4"}, {"#8c564b", ""}, {"#e377c2", "1 3"}, {"#17becf", "6 2 1 2"}, {"#bcbd22", "3 1"},
}

// svg draws the sweep as a line chart of events/s (linear) against
// concurrency (log scale); "" when the sweep did not run.
func (rep *report) svg() string {
	ss := rep.sweepSeries()
	if len(ss) == 0 {
		return ""
	}
	return lineChart("Events/s against concurrent streams ("+rep.Date[:10]+", "+strconv.Itoa(rep.Cores)+" cores, median of "+strconv.Itoa(rep.Rounds)+")",
		"concurrent streams", "events/s", ss)
}

// lineChart renders series as a self-contained SVG document.
func lineChart(title, xLabel, yLabel string, ss []series) string {
	const (
		w, h                     = 720, 440
		left, right, top, bottom = 80, 170, 40, 50
	)
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range ss {
		for i := range s.x {
			minX, maxX = math.Min(minX, s.x[i]), math.Max(maxX, s.x[i])
			maxY = math.Max(maxY, s.y[i])
		}
	}
	if maxY <= 0 {
		maxY = 1
	}
	step := niceStep(maxY / 5)
	maxY = math.Ceil(maxY/step) * step
	lx := func(x float64) float64 {
		if maxX <= minX {
			return float64(left) + pw/2
		}
		return float64(left) + (math.Log(x)-math.Log(minX))/(math.Log(maxX)-math.Log(minX))*pw
	}
	ly := func(y float64) float64 { return float64(top) + ph - y/maxY*ph }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	// Grid and y ticks.
	for y := 0.0; y <= maxY+step/2; y += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>`+"\n", left, ly(y), float64(left)+pw, ly(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, ly(y)+4, fmtNum(y, 0))
	}
	// x ticks at every concurrency measured.
	xs := map[float64]bool{}
	for _, s := range ss {
		for _, x := range s.x {
			xs[x] = true
		}
	}
	for x := range xs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#eeeeee"/>`+"\n", lx(x), top, lx(x), float64(top)+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", lx(x), float64(top)+ph+16, fmtNum(x, 0))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#888888"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s (log scale)</text>`+"\n", float64(left)+pw/2, h-10, html.EscapeString(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+ph/2, html.EscapeString(yLabel))
	// Series and legend.
	for i, s := range ss {
		p := palette[i%len(palette)]
		pts := make([]string, len(s.x))
		for k := range s.x {
			pts[k] = fmt.Sprintf("%.1f,%.1f", lx(s.x[k]), ly(s.y[k]))
		}
		dash := ""
		if p.dash != "" {
			dash = ` stroke-dasharray="` + p.dash + `"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", p.color, dash, strings.Join(pts, " "))
		for k := range s.x {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s, %s: %s events/s</title></circle>`+"\n",
				lx(s.x[k]), ly(s.y[k]), p.color, html.EscapeString(s.name), fmtNum(s.x[k], 0), fmtNum(s.y[k], 0))
		}
		ly0 := float64(top + 10 + 20*i)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", float64(left)+pw+12, ly0, float64(left)+pw+40, ly0, p.color, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", float64(left)+pw+46, ly0+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}
