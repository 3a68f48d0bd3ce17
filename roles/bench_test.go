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

// TestBenchSubscribeCommand: okso bench --mode subscribe holds a metric
// stream per node through the SSE door, counts the one the tenant's quota
// refuses, and leaves no stream open on the gateway.
func TestBenchSubscribeCommand(t *testing.T) {
	f := startAllInOne(t, 3, func(c *AllInOneConfig) { c.Gateway.MaxStreamsPerTenant = 3 })
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs([]string{"bench", "--mode", "subscribe", "--url", f.a.MCPURL(), "--token", f.token(auth.MintOptions{}),
		"--tool", "sys.*.metrics.subscribe", "--concurrency", "4", "--duration", "2s", "--warmup", "100ms", "--json"})
	if err := root.Execute(); err != nil {
		t.Fatalf("bench: %v\n%s", err, errOut.String())
	}
	var r struct {
		Tools       int               `json:"tools"`
		StreamsOpen int               `json:"streams_open"`
		Frames      int               `json:"frames"`
		Errors      map[string]uint64 `json:"errors"`
		FirstFrame  *struct{}         `json:"first_frame_latency_ms"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench --json output %q: %v", out.String(), err)
	}
	// Each stream gets a frame at once and one a second later, in the
	// measured time.
	if r.Tools != 3 || r.StreamsOpen != 3 || r.Frames < 3 || r.FirstFrame == nil ||
		len(r.Errors) != 1 || r.Errors["close/4429"] != 1 {
		t.Errorf("bench result %s: want 3 tools, 3 streams held with frames, one refused with close/4429", out.String())
	}
	eventually(t, "gateway streams closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })
}
