package roles

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/auth"
)

// TestBenchCommand: okso bench drives a running gateway, spreading calls
// over every tool of a prefix, and reports in JSON.
func TestBenchCommand(t *testing.T) {
	f := startAllInOne(t, 3, nil)
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs([]string{"bench", "--url", f.a.MCPURL(), "--token", f.token(auth.MintOptions{}),
		"--tool", "sysecho.*", "--duration", "500ms", "--warmup", "100ms", "--concurrency", "2",
		"--sessions", "1", "--json"})
	if err := root.Execute(); err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var r struct {
		Tools  int               `json:"tools"`
		OK     uint64            `json:"ok"`
		Errors map[string]uint64 `json:"errors"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench --json output %q: %v", out.String(), err)
	}
	if r.Tools != 3 || r.OK == 0 {
		t.Errorf("bench result %+v: want 3 tools and some ok calls", r)
	}
	for code, n := range r.Errors {
		if code != "E_RATE_LIMITED" { // 10 calls/s per mock node
			t.Errorf("bench saw %d × %s", n, code)
		}
	}
}
