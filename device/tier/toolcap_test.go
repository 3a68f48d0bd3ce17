package tier_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// echoCaps returns n system.echo capabilities: n tools.
func echoCaps(n int) []schemas.Capability {
	caps := make([]schemas.Capability, n)
	for i := range caps {
		caps[i] = tiertest.EchoCap("e"+strconv.Itoa(i), schemas.Constraints{})
	}
	return caps
}

// announceOutcome announces caps for node on an authenticated client and
// returns "announce_ok", or the close code and the error frame's message.
// It does not fail the test, so that goroutines may call it.
func announceOutcome(ctx context.Context, rc *rawClient, node string, caps []schemas.Capability) string {
	ctx, cancel := context.WithTimeout(ctx, tiertest.WaitFor)
	defer cancel()
	b, err := wire.Encode(wire.TypeAnnounce, "", manifest(node, caps...))
	if err != nil {
		return err.Error()
	}
	if err := rc.c.Write(ctx, websocket.MessageText, b); err != nil {
		return err.Error()
	}
	msg := ""
	for {
		_, b, err := rc.c.Read(ctx)
		if err != nil {
			if code := websocket.CloseStatus(err); code != -1 {
				return strconv.Itoa(int(code)) + " " + msg
			}
			return err.Error()
		}
		e, err := wire.DecodeEnvelope(rc.set, b)
		if err != nil {
			return err.Error()
		}
		if e.Type != wire.TypeError {
			return e.Type
		}
		var f wire.ErrorFrame
		if wire.DecodePayload(e, &f) == nil {
			msg = f.Code + " " + f.Message
		}
	}
}

// connectTools connects node of ten with tools echo capabilities to the
// tier at url and returns the client and how its announce ended.
func (tt *testTier) connectTools(t *testing.T, url, node, ten string, tools int) (*rawClient, string) {
	t.Helper()
	rc := tt.dialURL(t, url, nil)
	rc.authenticate(t, tt.tokenOf(t, node, ten))
	return rc, announceOutcome(t.Context(), rc, node, echoCaps(tools))
}

// wantCapRefused fails the test unless outcome is the tool cap's refusal.
func wantCapRefused(t *testing.T, outcome string) {
	t.Helper()
	if want := strconv.Itoa(wire.CloseForbidden) + " " + schemas.CodeSafetyDenied; !strings.HasPrefix(outcome, want) ||
		!strings.Contains(outcome, "tool cap") {
		t.Fatalf("announce: %q, want %s saying the tool cap is reached", outcome, want)
	}
}

// TestToolCap: a tenant's nodes register tools up to the cap, exactly; one
// more is refused with 4403, another tenant is not affected, a node that
// reconnects does not count twice, and room that frees up is given again.
func TestToolCap(t *testing.T) {
	tt := newTestTier(t, tier.Options{MaxToolsPerTenant: 3})
	a, b := wire.NewNodeID(), wire.NewNodeID()
	oldA, got := tt.connectTools(t, tt.URL, a, tiertest.Tenant, 2)
	if got != wire.TypeAnnounceOK {
		t.Fatalf("node a, 2 tools: %s", got)
	}
	rcB, got := tt.connectTools(t, tt.URL, b, tiertest.Tenant, 1)
	if got != wire.TypeAnnounceOK {
		t.Fatalf("node b, 1 tool, reaching the cap: %s", got)
	}
	c := wire.NewNodeID()
	_, got = tt.connectTools(t, tt.URL, c, tiertest.Tenant, 1)
	wantCapRefused(t, got)
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionDenied && e.NodeID == c && e.Code == schemas.CodeSafetyDenied
	})
	if r := tt.Record(t, c); r != nil {
		t.Fatalf("refused node has a registry record %+v", r)
	}
	if _, got := tt.connectTools(t, tt.URL, wire.NewNodeID(), intruder, 3); got != wire.TypeAnnounceOK {
		t.Fatalf("another tenant's node, 3 tools: %s", got)
	}

	// Node a again, with its 2 tools: they replace its own.
	if _, got := tt.connectTools(t, tt.URL, a, tiertest.Tenant, 2); got != wire.TypeAnnounceOK {
		t.Fatalf("node a reconnecting: %s", got)
	}
	if code, _ := oldA.waitClose(t); code != wire.CloseReplaced {
		t.Fatalf("node a's first session closed with %d, want %d", code, wire.CloseReplaced)
	}

	// Node b leaves: its tool is free again, once the registry says so.
	_ = rcB.c.Close(websocket.StatusNormalClosure, "")
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(tiertest.WaitFor)
	for {
		rc, got := tt.connectTools(t, tt.URL, c, tiertest.Tenant, 1)
		if got == wire.TypeAnnounceOK {
			break
		}
		wantCapRefused(t, got)
		_ = rc.c.CloseNow()
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("node c still refused after node b left")
		}
	}

	t.Run("no cap", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{MaxToolsPerTenant: -1})
		for range 3 {
			if _, got := tt.connectTools(t, tt.URL, wire.NewNodeID(), tiertest.Tenant, 64); got != wire.TypeAnnounceOK {
				t.Fatalf("announce of 64 tools without a cap: %s", got)
			}
		}
	})
}

// TestToolCapConcurrent: announces that reach one tier at once are
// counted as they are admitted, not when the registry shows them: exactly
// the cap's worth pass.
func TestToolCapConcurrent(t *testing.T) {
	const limit, nodes = 5, 12
	tt := newTestTier(t, tier.Options{MaxToolsPerTenant: limit})
	clients := make([]*rawClient, nodes)
	ids := make([]string, nodes)
	for i := range clients {
		ids[i] = wire.NewNodeID()
		clients[i] = tt.dial(t, nil)
		clients[i].authenticate(t, tt.Token(t, ids[i]))
	}
	outcomes := make([]string, nodes)
	var wg sync.WaitGroup
	for i, rc := range clients {
		wg.Go(func() { outcomes[i] = announceOutcome(t.Context(), rc, ids[i], echoCaps(1)) })
	}
	wg.Wait()
	accepted := 0
	for _, o := range outcomes {
		if o == wire.TypeAnnounceOK {
			accepted++
		} else {
			wantCapRefused(t, o)
		}
	}
	if accepted != limit {
		t.Fatalf("%d announces of one tool accepted under a cap of %d: %v", accepted, limit, outcomes)
	}
}

// TestToolCapAcrossTiers: a tier counts the tools its tenant registered
// on other tiers, from the registry, including those registered before
// it started.
func TestToolCapAcrossTiers(t *testing.T) {
	tt := newTestTier(t, tier.Options{MaxToolsPerTenant: 3})
	if _, got := tt.connectTools(t, tt.URL, wire.NewNodeID(), tiertest.Tenant, 3); got != wire.TypeAnnounceOK {
		t.Fatalf("3 tools on tier a: %s", got)
	}
	_, urlB := tt.StartReplica(t, tier.Options{MaxToolsPerTenant: 3})
	_, got := tt.connectTools(t, urlB, wire.NewNodeID(), tiertest.Tenant, 1)
	wantCapRefused(t, got)
	if _, got := tt.connectTools(t, urlB, wire.NewNodeID(), intruder, 3); got != wire.TypeAnnounceOK {
		t.Fatalf("another tenant on tier b: %s", got)
	}
}
