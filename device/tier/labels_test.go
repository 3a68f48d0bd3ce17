package tier_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestNodeLabels: the tier offers the feature labels in auth_ok, takes a
// device's name and labels, lets its operator's win key by key (the
// token's claim over the device's, the tier's settings over both), and
// writes the result in the node's registry record.
func TestNodeLabels(t *testing.T) {
	pinned := wire.NewNodeID()
	tt := newTestTier(t, tier.Options{Nodes: map[string]tier.NodeSettings{
		pinned: {Name: "operator-name", Labels: map[string]string{"site": "tier-file", "okso.io/rack": "r1"}},
	}})
	tokenLabels := map[string]string{"site": "token", "team": "ops"}
	token := func(node string) string {
		return tt.Mint(t, auth.MintOptions{Subject: node, Tenant: tiertest.Tenant, Scopes: []string{auth.ScopeDeviceConnect},
			Audience: auth.AudienceDevice, Labels: tokenLabels})
	}
	device := map[string]string{"site": "device", "role": "edge", "empty": ""}

	for _, tc := range []struct {
		name       string
		node       string
		old        bool // the device does not take the feature: an older device
		wantName   string
		wantLabels map[string]string
	}{
		{"device and token", wire.NewNodeID(), false, "kitchen-pi",
			map[string]string{"site": "token", "team": "ops", "role": "edge", "empty": ""}},
		{"device, token and tier", pinned, false, "operator-name",
			map[string]string{"site": "tier-file", "okso.io/rack": "r1", "team": "ops", "role": "edge", "empty": ""}},
		{"older device, token", wire.NewNodeID(), true, "", tokenLabels},
		{"older device, token and tier", pinned, true, "operator-name",
			map[string]string{"site": "tier-file", "okso.io/rack": "r1", "team": "ops"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := tt.dial(t, nil)
			ok := rc.authenticate(t, token(tc.node))
			if !slices.Contains(ok.Features, wire.FeatureLabels) {
				t.Fatalf("auth_ok features %v, want %s offered", ok.Features, wire.FeatureLabels)
			}
			m := manifest(tc.node, echoCapability())
			if !tc.old {
				m["features"] = []string{wire.FeatureDeadlineAt, wire.FeatureLabels}
				m["name"], m["labels"] = "kitchen-pi", device
			}
			rc.send(t, wire.TypeAnnounce, "", m)
			rc.recv(t, wire.TypeAnnounceOK, nil)
			rec := tt.Record(t, tc.node)
			if rec == nil {
				t.Fatal("no registry record after announce_ok")
			}
			if rec.Name != tc.wantName || !maps.Equal(rec.Labels, tc.wantLabels) {
				t.Errorf("record name %q labels %v; want %q %v", rec.Name, rec.Labels, tc.wantName, tc.wantLabels)
			}
			res := tt.GoCall(t.Context(), tc.node, tiertest.Tenant, tiertest.EchoTool(tc.node), `{"message":"hi"}`)
			rc.answerEcho(t, tc.node)
			tiertest.WantOK(t, <-res)
		})
	}

	t.Run("nothing to say", func(t *testing.T) {
		node := wire.NewNodeID()
		tt.connectRaw(t, node)
		rec := tt.Record(t, node)
		if rec == nil || rec.Name != "" || rec.Labels != nil {
			t.Fatalf("record %+v, want no name and no labels", rec)
		}
	})
}

// TestNodeLabelsRefused: a name or labels that break their rules, or
// come without the feature, close the session with 4400 and an error
// frame E_MANIFEST_INVALID that names the rule, not the device's text.
func TestNodeLabelsRefused(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	long := strings.Repeat("p", 63)
	longPrefix := strings.Join([]string{long, long, long, long}, ".") // 255: the schema's pattern passes it
	seventeen := map[string]string{}
	for i := range 17 {
		seventeen["k"+string(rune('a'+i))] = "v"
	}
	for _, tc := range []struct {
		name  string
		edit  func(m map[string]any)
		rule  string
		never string // device text the message must not carry
	}{
		{"name without the feature", func(m map[string]any) {
			delete(m, "features")
			m["name"] = "sneaky-name"
		},
			"without the feature labels", "sneaky-name"},
		{"labels with other features", func(m map[string]any) {
			m["features"] = []string{wire.FeatureDeadlineAt}
			m["labels"] = map[string]string{"site": "paris"}
		}, "without the feature labels", "paris"},
		{"name", func(m map[string]any) { m["name"] = "Evil<script>" }, "announce name is not", "script"},
		{"label key", func(m map[string]any) { m["labels"] = map[string]string{"Evil.com/x": "v"} },
			"label key prefix not a DNS subdomain", "Evil"},
		{"label key prefix length", func(m map[string]any) { m["labels"] = map[string]string{longPrefix + "/k": "v"} },
			"label key prefix longer than 253", long},
		{"label value", func(m map[string]any) { m["labels"] = map[string]string{"k": "drop table;"} },
			"label value not", "drop"},
		{"label value type", func(m map[string]any) { m["labels"] = map[string]any{"k": 7} },
			"label value is not a string", ""},
		{"too many labels", func(m map[string]any) { m["labels"] = seventeen }, "more than 16 labels", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := wire.NewNodeID()
			rc := tt.dial(t, nil)
			rc.authenticate(t, tt.Token(t, node))
			m := manifest(node, echoCapability())
			m["features"] = []string{wire.FeatureLabels}
			tc.edit(m)
			rc.send(t, wire.TypeAnnounce, "", m)
			code, frames := rc.waitClose(t)
			if code != wire.CloseMalformed || len(frames) != 1 || frames[0].Code != schemas.CodeManifestInvalid {
				t.Fatalf("close %d, error frames %+v; want 4400 after one %s", code, frames, schemas.CodeManifestInvalid)
			}
			if msg := frames[0].Message; !strings.Contains(msg, tc.rule) || tc.never != "" && strings.Contains(msg, tc.never) {
				t.Errorf("message %q: want it to say %q and not %q", msg, tc.rule, tc.never)
			}
			if tt.Record(t, node) != nil {
				t.Error("a refused node is in the registry")
			}
		})
	}
}

// TestNodeLabelsTokenClaim: a token whose labels break the rules is
// refused (4403) before anything is registered.
func TestNodeLabelsTokenClaim(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc := tt.dial(t, nil)
	rc.recv(t, wire.TypeHello, nil)
	rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.Mint(t, auth.MintOptions{Subject: node, Tenant: tiertest.Tenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice, Labels: map[string]string{"k": "-bad"}})})
	code, frames := rc.waitClose(t)
	if code != websocket.StatusCode(wire.CloseForbidden) || len(frames) != 1 || !strings.Contains(frames[0].Message, "token labels claim") {
		t.Fatalf("close %d, frames %+v; want 4403 naming the token's labels claim", code, frames)
	}
}

// TestNodeSettingsChecked: the tier refuses, at start, settings that
// break the rules a device is held to.
func TestNodeSettingsChecked(t *testing.T) {
	for rule, nodes := range map[string]map[string]tier.NodeSettings{
		"not a node id":                     {"not-a-node": {}},
		"is not ^[a-z0-9][a-z0-9.-]{0,62}$": {wire.NewNodeID(): {Name: "Upper"}},
		"label value not":                   {wire.NewNodeID(): {Labels: map[string]string{"k": "v v"}}},
	} {
		// The rest of the options is missing too: the settings are
		// checked first, so the error must be theirs.
		if _, err := tier.New(tier.Options{Nodes: nodes}); err == nil || !strings.Contains(err.Error(), rule) {
			t.Errorf("tier.New with nodes %v: %v, want an error saying %q", nodes, err, rule)
		}
	}
}
