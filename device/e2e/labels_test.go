package e2e_test

import (
	"maps"
	"testing"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// TestNodeLabels: a device of package agent announces its name and
// labels to the tier, which registers them under its operator's, the
// token's labels claim and the tier's settings winning key by key.
func TestNodeLabels(t *testing.T) {
	node := wire.NewNodeID()
	tt := newTestTier(t, tier.Options{Nodes: map[string]tier.NodeSettings{
		node: {Labels: map[string]string{"zone": "b"}},
	}})
	o := agent.MockOptions(node, tt.Schemas, 1)
	o.Name, o.Labels = "kitchen-pi", map[string]string{"zone": "a", "role": "edge", "owner": "device"}
	o.Token = tt.Mint(t, auth.MintOptions{Subject: node, Tenant: tiertest.Tenant, Scopes: []string{auth.ScopeDeviceConnect},
		Audience: auth.AudienceDevice, Labels: map[string]string{"owner": "ops"}})
	tt.runDevice(t, o)
	rec := tt.Record(t, node)
	want := map[string]string{"zone": "b", "role": "edge", "owner": "ops"}
	if rec == nil || rec.Name != "kitchen-pi" || !maps.Equal(rec.Labels, want) {
		t.Fatalf("record %+v; want name kitchen-pi and labels %v", rec, want)
	}
	tt.Echo(t, node)
}
