package e2e_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// TestDeviceRefused checks that agent.Device.Run gives up with a
// *agent.CloseError when the tier refuses it for good.
func TestDeviceRefused(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	tests := []struct {
		name  string
		token string
		want  int
	}{
		{"bad token", "not.a.jwt", wire.CloseAuthFailed},
		{"token lacking device:connect", tt.Mint(t, auth.MintOptions{Subject: node, Tenant: tiertest.Tenant,
			Scopes: []string{auth.ScopeReadOnly}, Audience: auth.AudienceDevice}), wire.CloseForbidden},
		{"token of another node", tt.Token(t, wire.NewNodeID()), wire.CloseForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := agent.MockOptions(node, tt.Schemas, 1)
			o.URLs, o.Token = []string{tt.URL}, tc.token
			d, err := agent.New(o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
			defer cancel()
			err = d.Run(ctx)
			var ce *agent.CloseError
			if !errors.As(err, &ce) || ce.Code != tc.want {
				t.Fatalf("Run: %v, want a *CloseError with %d", err, tc.want)
			}
		})
	}
}

// TestFailover shuts a tier down under a device: the device gets 1001,
// says so once (OnLost), reconnects to the next tier, and its node is
// served from there. Stopping the device is no loss.
func TestFailover(t *testing.T) {
	tt := newTestTier(t, tier.Options{Name: "tier-a"})
	tierB, urlB := tt.StartReplica(t, tier.Options{Name: "tier-b"})
	o := agent.MockOptions(wire.NewNodeID(), tt.Schemas, 1)
	o.URLs = []string{tt.URL, urlB}
	o.MinBackoff, o.MaxBackoff = time.Millisecond, 10*time.Millisecond
	lost := make(chan error, 8)
	o.OnLost = func(err error) { lost <- err }
	d := tt.runDevice(t, o)
	// The device starts at a random tier of its list; shut that one down.
	r := tt.Record(t, d.node)
	if r == nil || (r.Tier != "tier-a" && r.Tier != "tier-b") {
		t.Fatalf("registry record %+v, want one from tier-a or tier-b", r)
	}
	from, to, toTier := tt.Tier, tierB, "tier-b"
	if r.Tier == "tier-b" {
		from, to, toTier = tierB, tt.Tier, "tier-a"
	}

	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	if err := from.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.ready:
	case <-ctx.Done():
		t.Fatal("device did not reconnect")
	}
	if r := tt.Record(t, d.node); r == nil || r.Tier != toTier {
		t.Fatalf("registry record %+v, want one from %s", r, toTier)
	}
	if n := to.Sessions(); n != 1 {
		t.Errorf("%s has %d sessions, want 1", toTier, n)
	}
	tt.Echo(t, d.node)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	close(lost) // Run has returned: no call comes after
	var errs []error
	for err := range lost {
		errs = append(errs, err)
	}
	var wce websocket.CloseError
	if len(errs) != 1 || !errors.As(errs[0], &wce) || wce.Code != wire.CloseGoingAway {
		t.Errorf("OnLost called with %v, want once with the tier's close 1001", errs)
	}
}

// TestDeviceOfAnotherTenantGivesUp: an agent.Device whose token is of
// another tenant than the one its node id is bound to is refused with 4403,
// and Run gives up for good instead of retrying.
func TestDeviceOfAnotherTenantGivesUp(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	owner := tt.runMock(t)
	if err := owner.stop(); err != nil { // the node id stays bound to its tenant
		t.Fatal(err)
	}
	o := agent.MockOptions(owner.node, tt.Schemas, 1)
	o.URLs = []string{tt.URL}
	o.Token = tt.Mint(t, auth.MintOptions{Subject: owner.node, Tenant: "evil",
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	d, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	var ce *agent.CloseError
	if err := d.Run(ctx); !errors.As(err, &ce) || ce.Code != wire.CloseForbidden {
		t.Fatalf("Run: %v, want a *CloseError with %d", err, wire.CloseForbidden)
	}
}
