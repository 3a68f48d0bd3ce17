package e2e_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestImportRules: the packages of device/ import only what DESIGN.md §10
// allows them, their tests included; above all, the tier and the device
// end never import each other (they meet only on a socket, and only this
// package runs them together). internal/jsonscan and device/internal are machinery
// that is nobody's domain.
func TestImportRules(t *testing.T) {
	const mod = "github.com/okso-io/okso/"
	allowed := map[string][]string{
		"wire":             {"schemas", "internal/jsonscan", "device/wire"},
		"tier":             {"device/wire", "bus", "schemas", "auth", "internal/jsonscan", "device/internal/workers", "device/tier"},
		"agent":            {"device/wire", "schemas", "internal/jsonscan", "device/internal/workers", "device/agent"},
		"internal/workers": {},
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join("..", dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("device/%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range file.Imports {
				path, _ := strconv.Unquote(im.Path.Value)
				if p, ours := strings.CutPrefix(path, mod); ours && !slices.Contains(ok, p) {
					t.Errorf("%s imports %s: device/%s may import only %v", f, path, dir, ok)
				}
			}
		}
	}
}
