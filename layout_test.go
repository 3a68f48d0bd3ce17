package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLayout: every package imports only what DESIGN.md §10 allows it,
// its tests included. Above all, mcp, the device tier, the device end and
// the remote tier never import each other: they meet only on NATS or a
// socket, and only device/e2e (and the composition root) runs two of them
// together. internal/ is machinery anyone may use, and which uses no part
// of okso but other machinery; bench drives any MCP endpoint and knows
// okso's contract only; device/internal is the
// device packages', remote/internal the remote tier's (its test
// upstream). A package there with a row here is checked like the others;
// a test harness there (harnessOf) may be imported only by the tests it
// names: device/internal/tiertest starts a tier, so device/agent's tests
// may not use it. A new package must be added here, which is the moment
// to decide what it may import.
func TestLayout(t *testing.T) {
	const mod = "github.com/okso-io/okso/"
	allowed := map[string][]string{
		"mcp":          {"bus", "schemas", "auth"},
		"device/wire":  {"schemas"},
		"device/tier":  {"device/wire", "bus", "schemas", "auth"},
		"device/agent": {"device/wire", "schemas", "action"},
		"device/e2e":   {"device/wire", "device/tier", "device/agent", "bus", "schemas", "auth"},
		"remote":       {"bus", "schemas", "action"},
		"action":       {"schemas"},
		"bus":          {"schemas"},
		"schemas":      {},
		"auth":         {},
		"bench":        {"schemas"}, // a load driver for any MCP endpoint: okso's contract, none of its parts

		"device/internal/tiertest": {"device/wire", "device/tier", "bus", "schemas", "auth"},
	}
	// What a package's tests may import besides: the contract a copy of a
	// rule is proved against.
	testOnly := map[string][]string{
		"auth": {"schemas"},
	}
	// Harnesses for tests: which packages' tests may import them.
	harnessOf := map[string][]string{
		"device/internal/tiertest": {"device/tier", "device/e2e"},
	}
	// The composition root and the tools around it import what they need.
	unchecked := []string{".", "roles", "interop", "deploy", "scripts"}

	seen := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		top, _, _ := strings.Cut(pkg, "/")
		ok, known := allowed[pkg]
		if !known && strings.HasPrefix(pkg, "internal/") {
			ok, known = nil, true // machinery: other machinery only
			seen[pkg] = true
		}
		if !known && (slices.Contains(unchecked, pkg) || slices.Contains(unchecked, top) ||
			strings.HasPrefix(pkg, "device/internal/") || strings.HasPrefix(pkg, "remote/internal/")) {
			return nil
		}
		if !known {
			if !seen[pkg] {
				t.Errorf("package %s is not in DESIGN.md §10's table here: say what it may import", pkg)
			}
			seen[pkg] = true
			return nil
		}
		seen[pkg] = true
		file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, im := range file.Imports {
			imp, _ := strconv.Unquote(im.Path.Value)
			p, ours := strings.CutPrefix(imp, mod)
			switch {
			case ours && harnessOf[p] != nil:
				if !strings.HasSuffix(path, "_test.go") || !slices.Contains(harnessOf[p], pkg) {
					t.Errorf("%s imports %s: only the tests of %v may", path, imp, harnessOf[p])
				}
			case !ours, p == pkg, strings.HasPrefix(p, "internal/"), slices.Contains(ok, p):
			case strings.HasPrefix(p, "device/internal/") && strings.HasPrefix(pkg, "device/"):
			case strings.HasPrefix(p, "remote/internal/") && (pkg == "remote" || strings.HasPrefix(pkg, "remote/")):
			case strings.HasSuffix(path, "_test.go") && slices.Contains(testOnly[pkg], p):
			default:
				t.Errorf("%s imports %s: %s may import only %v", path, imp, pkg, ok)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg := range allowed {
		if !seen[pkg] && pkg != "remote" { // remote: the federation issue's
			t.Errorf("no Go files in %s: is the table out of date?", pkg)
		}
	}
}
