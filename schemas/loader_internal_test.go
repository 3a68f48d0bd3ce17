package schemas

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

func TestRefuseLoader(t *testing.T) {
	for _, url := range []string{
		"http://evil.example/x",
		"https://json-schema.org/draft/2020-12/schema",
		"file:///etc/passwd",
		"mcp://schemas/nope@1.0.0",
	} {
		v, err := refuseLoader{}.Load(url)
		if err == nil {
			t.Errorf("Load(%s): no error", url)
		}
		if v != nil {
			t.Errorf("Load(%s) returned a document: %v", url, v)
		}
		if err != nil && !strings.Contains(err.Error(), url) {
			t.Errorf("Load(%s): error %q does not name the URL", url, err)
		}
	}
}

// A schema compiled the way Load compiles never fetches an http:// or
// file:// reference: the compile fails and nothing is read.
func TestReferencesAreNeverFetched(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"type":"string"}`))
	}))
	defer srv.Close()

	// A real schema file that a file:// reference could reach.
	dir := t.TempDir()
	target := filepath.Join(dir, "target.json")
	if err := os.WriteFile(target, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	fileURL := "file://" + filepath.ToSlash(target)

	refs := map[string]string{
		"http":          srv.URL + "/x.json",
		"file":          fileURL,
		"mcp unknown":   IDPrefix + "nope@1.0.0",
		"http evil":     "http://evil.example/x",
		"file passwd":   "file:///etc/passwd",
		"relative file": "target.json",
	}
	for name, ref := range refs {
		t.Run(name, func(t *testing.T) {
			c := jsonschema.NewCompiler()
			c.UseLoader(refuseLoader{})
			id := IDPrefix + "test.ref@1.0.0"
			doc := map[string]any{
				"$schema":    "https://json-schema.org/draft/2020-12/schema",
				"$id":        id,
				"type":       "object",
				"properties": map[string]any{"x": map[string]any{"$ref": ref}},
			}
			if err := c.AddResource(id, doc); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Compile(id); err == nil {
				t.Fatalf("compile with $ref %s succeeded", ref)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the http server was fetched %d times", n)
	}

	// Control: the library's default loader does read file:// references,
	// so the refusal above is the loader's doing.
	c := jsonschema.NewCompiler()
	id := "http://control.example/s.json"
	if err := c.AddResource(id, map[string]any{"$ref": fileURL}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compile(id); err != nil {
		t.Fatalf("control compile with the default loader: %v", err)
	}
}
