package agent_test

import (
	"context"
	"encoding/json"
	"runtime"
	"testing"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestHostMetricsWithinSchema: this machine's real figures, through the
// agent's handlers, fit the snapshot and frame schemas.
func TestHostMetricsWithinSchema(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("host metrics are read from Linux's /proc")
	}
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	node := wire.NewNodeID()
	handlers, streams := agent.Metrics(node, &agent.HostSampler{})
	res, err := handlers["metrics.snapshot"](t.Context(), json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(res)
	if err := set.ValidateJSON(schemas.MetricsSnapshot, b); err != nil {
		t.Fatalf("host snapshot %s: %v", b, err)
	}
	var s agent.MetricsSample
	_ = json.Unmarshal(b, &s)
	if s.MemTotalBytes <= 0 || s.MemBytes > s.MemTotalBytes || s.NodeID != node {
		t.Errorf("implausible sample %+v", s)
	}

	// Two frames of a subscription, then cancel: the loop ends.
	ctx, cancel := context.WithCancel(t.Context())
	var frames [][]byte
	err = streams["metrics.subscribe"](ctx, json.RawMessage(`{"interval_ms":1000}`), func(f any) error {
		b, _ := json.Marshal(f)
		frames = append(frames, b)
		if len(frames) == 2 {
			cancel()
		}
		return nil
	})
	if err != nil || len(frames) != 2 {
		t.Fatalf("subscribe ended with %v after %d frames", err, len(frames))
	}
	for _, f := range frames {
		if err := set.ValidateJSON(schemas.MetricsFrame, f); err != nil {
			t.Errorf("host frame %s: %v", f, err)
		}
	}
}

// TestMockSamplerSeeded: a seeded walk is reproducible, stays within the
// schema, and differs between devices.
func TestMockSamplerSeeded(t *testing.T) {
	set, _ := schemas.Load()
	a, b := agent.NewMockSampler(42, "n1"), agent.NewMockSampler(42, "n1")
	c := agent.NewMockSampler(42, "n2")
	differ := false
	for i := range 500 {
		sa, _ := a.Sample(t.Context())
		sb, _ := b.Sample(t.Context())
		sc, _ := c.Sample(t.Context())
		if sa != sb {
			t.Fatalf("step %d: same seed, different samples %+v %+v", i, sa, sb)
		}
		differ = differ || sa != sc
		sa.TsMs, sa.NodeID = 1745300000000, "01hzx9k3m4p7q8r9s0t1v2w3xy"
		js, _ := json.Marshal(sa)
		if err := set.ValidateJSON(schemas.MetricsFrame, js); err != nil {
			t.Fatalf("step %d: %s: %v", i, js, err)
		}
	}
	if !differ {
		t.Error("two devices walk the same path")
	}
}
