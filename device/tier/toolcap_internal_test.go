package tier

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// recordOf is a registry record of node in tenant, written by session,
// with one capability of the given verbs.
func recordOf(t *testing.T, node, tenant, session string, verbs ...string) []byte {
	t.Helper()
	b, err := json.Marshal(bus.Node{NodeID: node, Tenant: tenant, SessionID: session,
		Capabilities: []schemas.Capability{{CapID: "c", Kind: "system.metrics", Verbs: verbs}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mockCapabilities are the capabilities a mock device announces (echo,
// metrics and a GPIO pin: five verbs), written out here because the
// tier's tests do not import the device end.
func mockCapabilities() []schemas.Capability {
	return []schemas.Capability{
		{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput, Verbs: []string{"invoke"},
			SafetyClass: schemas.SafetyReadOnly, Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000}},
		{CapID: "metrics", Kind: schemas.KindMetrics, SchemaRef: schemas.MetricsSubInput, Verbs: []string{"snapshot", "subscribe"},
			SafetyClass: schemas.SafetyReadOnly, Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 8, DeadlineMsDefault: 2000}},
		{CapID: "pin", Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput, Verbs: []string{"read", "write"},
			SafetyClass: schemas.SafetyMutating, Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 1, DeadlineMsDefault: 2000}},
	}
}

func wantCounts(t *testing.T, c *toolCounts, want map[string]int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !maps.Equal(c.tenants, want) {
		t.Fatalf("tools by tenant %v, want %v", c.tenants, want)
	}
}

// TestToolCounts follows the counts through the life of a few nodes: an
// admission counts until its record replaces it or its session ends, a
// refresh changes nothing, a node counts once whatever happens to it.
func TestToolCounts(t *testing.T) {
	const n1, n2, n3 = "node1", "node2", "node3"
	c := newToolCounts()
	c.resync()
	c.apply(n1, recordOf(t, n1, "a", "s1", "snapshot", "subscribe"))
	c.apply("junk", []byte(`not json`))
	c.apply(n3, recordOf(t, "other", "a", "s9", "snapshot")) // a key that is not its node's
	c.loaded()
	select {
	case <-c.ready:
	default:
		t.Fatal("not ready after the initial state")
	}
	wantCounts(t, c, map[string]int{"a": 2})

	// An admission counts at once; at the cap, the next is refused.
	if !c.admit("s2", n2, "a", 1, 3) {
		t.Fatal("admission up to the cap refused")
	}
	wantCounts(t, c, map[string]int{"a": 3})
	if c.admit("s3", n3, "a", 1, 3) {
		t.Fatal("admission over the cap accepted")
	}
	if !c.admit("s3", n3, "b", 3, 3) {
		t.Fatal("another tenant's admission refused")
	}
	wantCounts(t, c, map[string]int{"a": 3, "b": 3})

	// n2's record shows up: it replaces the admission, and its refreshes
	// change nothing.
	rec2 := recordOf(t, n2, "a", "s2", "snapshot")
	for range 3 {
		c.apply(n2, rec2)
		wantCounts(t, c, map[string]int{"a": 3, "b": 3})
	}
	c.release("s2", n2) // the session ends after its record showed
	wantCounts(t, c, map[string]int{"a": 3, "b": 3})
	c.apply(n2, nil)
	wantCounts(t, c, map[string]int{"a": 2, "b": 3})

	// n3's session ends before its record was written.
	c.release("s3", n3)
	wantCounts(t, c, map[string]int{"a": 2})

	// A newer session of n1 re-announces with one tool more: its own
	// record does not count against it, and the older session's end does
	// not drop the newer admission.
	if !c.admit("s4", n1, "a", 3, 3) {
		t.Fatal("re-announce refused for its own tools")
	}
	c.release("s1", n1)
	wantCounts(t, c, map[string]int{"a": 3})
	c.apply(n1, recordOf(t, n1, "a", "s4", "snapshot", "subscribe", "x"))
	wantCounts(t, c, map[string]int{"a": 3})

	// A new watch that no longer reports n1 drops it when loaded.
	c.resync()
	c.apply(n2, rec2)
	wantCounts(t, c, map[string]int{"a": 4})
	c.loaded()
	wantCounts(t, c, map[string]int{"a": 1})
}

// BenchmarkToolCountsRefresh: the registry update a tier sees most, a
// lease refresh of a record it counted already (each node's, every 5 s).
func BenchmarkToolCountsRefresh(b *testing.B) {
	c := newToolCounts()
	rec, err := json.Marshal(bus.Node{NodeID: "n", Tenant: "acme", SessionID: "s", Tier: "tier-a",
		Agent:        schemas.Agent{Name: "okso-mock", Version: "1.0.0"},
		Capabilities: mockCapabilities()})
	if err != nil {
		b.Fatal(err)
	}
	c.apply("n", rec)
	b.ReportAllocs()
	for b.Loop() {
		c.apply("n", rec)
	}
}

// BenchmarkToolCountsChange: a record that changed (a new session).
func BenchmarkToolCountsChange(b *testing.B) {
	c := newToolCounts()
	var recs [2][]byte
	for i := range recs {
		var err error
		recs[i], err = json.Marshal(bus.Node{NodeID: "n", Tenant: "acme", SessionID: string(rune('a' + i)), Tier: "tier-a",
			Agent:        schemas.Agent{Name: "okso-mock", Version: "1.0.0"},
			Capabilities: mockCapabilities()})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.apply("n", recs[i&1])
		i++
	}
}
