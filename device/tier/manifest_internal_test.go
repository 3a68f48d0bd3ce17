package tier

import (
	"testing"

	"github.com/okso-io/okso/schemas"
)

// projected projects the built-in echo and metrics capabilities for node.
func projected(t *testing.T, node string) *manifest {
	t.Helper()
	caps := []schemas.Capability{
		{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput, Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly,
			Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4}},
		{CapID: "metrics", Kind: schemas.KindMetrics, SchemaRef: schemas.MetricsSubInput,
			Verbs: []string{"snapshot", "subscribe"}, SafetyClass: schemas.SafetyReadOnly},
	}
	tools, mf, msg := project(nil, node, caps)
	if msg != "" {
		t.Fatal(msg)
	}
	if len(tools) != 3 || len(mf.entries) != 2 || mf.entries[1].cap != &mf.caps[1] || mf.entries[1].kind.Name != schemas.KindMetrics {
		t.Fatalf("projected %v into %+v", tools, mf.entries)
	}
	return mf
}

// TestManifestsShared: sessions that announce the same capabilities with
// the same kinds hold one manifest, until the last of them releases it;
// other kinds are not shared.
func TestManifestsShared(t *testing.T) {
	var ms manifests
	a := ms.share(projected(t, "01m8f7ppy83cvtxg0zt4afjb4a"))
	b := ms.share(projected(t, "01m8f7ppy83cvtxg0zt4afjb4b"))
	if a != b || a.refs != 2 {
		t.Fatalf("equal manifests: %p and %p (refs %d), want one held twice", a, b, a.refs)
	}
	other := projected(t, "01m8f7ppy83cvtxg0zt4afjb4c")
	other.entries[0].kind.Major = 2 // as if the kind table had changed
	if c := ms.share(other); c != other {
		t.Fatal("a manifest projected with other kinds was shared")
	}
	ms.release(other)
	ms.release(a)
	if len(ms.byKey) != 1 {
		t.Fatalf("released once of twice: %d manifests held, want 1", len(ms.byKey))
	}
	ms.release(b)
	if len(ms.byKey) != 0 {
		t.Fatalf("released by every session: %d manifests held, want 0", len(ms.byKey))
	}
	// States are each session's own.
	s1, s2 := a.states(), a.states()
	if !s1[0].allow() || s2[0].limiter != nil || s1[0].capEntry != s2[0].capEntry {
		t.Fatal("a session's limiter is not its own, or its capability not the shared one")
	}
}
