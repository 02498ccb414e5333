// Package doctable reads the tables that doc comments draw, so that a test
// can hold the code to the transitions its comment documents.
package doctable

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// Rows returns the lines of the table in the doc comment of type typeName
// in the Go file path: the comment's indented lines (a table in a doc
// comment is a code block), without their indent.
func Rows(tb testing.TB, path, typeName string) []string {
	tb.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
	if err != nil {
		tb.Fatal(err)
	}
	var rows []string
	for _, d := range file.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE || gd.Specs[0].(*ast.TypeSpec).Name.Name != typeName {
			continue
		}
		for line := range strings.Lines(gd.Doc.Text()) {
			if strings.HasPrefix(line, "\t") && strings.TrimSpace(line) != "" {
				rows = append(rows, strings.TrimSpace(line))
			}
		}
	}
	if len(rows) == 0 {
		tb.Fatalf("no table in the comment of %s in %s", typeName, path)
	}
	return rows
}
