// Package docrefs reads what Markdown pages name — files, links and their
// anchors, fuzz targets, flags — so that a test can hold the README and
// docs/ to the tree they describe. Its own test does so for this
// repository.
package docrefs

import (
	"regexp"
	"strings"
	"unicode"
)

// Row is one row of a layout map: a directory and the files it names.
type Row struct {
	Dir   string   // the first code span of the row's first cell
	Files []string // the code spans of its other cells that end in .go (globs allowed)
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// Layout returns the rows of the Markdown tables in md whose first cell
// opens with a code span: a layout map's rows.
func Layout(md string) []Row {
	var rows []Row
	for line := range strings.Lines(md) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 4 || cells[0] != "" {
			continue
		}
		first := codeSpan.FindStringSubmatch(strings.TrimSpace(cells[1]))
		if first == nil || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		r := Row{Dir: first[1]}
		for _, c := range cells[2:] {
			for _, m := range codeSpan.FindAllStringSubmatch(c, -1) {
				if strings.HasSuffix(m[1], ".go") && !strings.ContainsAny(m[1], " /") {
					r.Files = append(r.Files, m[1])
				}
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// CodeSpans returns the code spans of md outside its fenced code blocks.
func CodeSpans(md string) []string {
	var spans []string
	for _, m := range codeSpan.FindAllStringSubmatch(prose(md), -1) {
		spans = append(spans, m[1])
	}
	return spans
}

var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Links returns the targets of md's inline links, outside its fenced code
// blocks.
func Links(md string) []string {
	var out []string
	for _, m := range link.FindAllStringSubmatch(prose(md), -1) {
		out = append(out, m[1])
	}
	return out
}

var fuzzName = regexp.MustCompile(`\bFuzz[A-Z][A-Za-z0-9_]*`)

// FuzzNames returns the fuzz targets md names (Fuzz followed by a capital).
func FuzzNames(md string) []string { return fuzzName.FindAllString(md, -1) }

var flagName = regexp.MustCompile(`^-([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?:[ =]|$)`)

// Flags returns the flags md's code spans open with (`-name`,
// `-name value`, `-name=value`), without their dash.
func Flags(md string) []string {
	var out []string
	for _, s := range CodeSpans(md) {
		if m := flagName.FindStringSubmatch(s); m != nil {
			out = append(out, m[1])
		}
	}
	return out
}

// Anchors returns the anchors of md's headings, as GitHub makes them:
// lower case, punctuation but hyphens dropped, spaces made hyphens.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	for line := range strings.Lines(prose(md)) {
		t := strings.TrimSpace(line)
		if !strings.HasPrefix(t, "#") {
			continue
		}
		t = strings.TrimSpace(strings.TrimLeft(t, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(t) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}

// prose returns md without its fenced code blocks.
func prose(md string) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(line)
		}
	}
	return b.String()
}
