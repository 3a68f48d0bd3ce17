package agent_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestAnnounceLabels: a device announces its name and labels to a tier
// that offers the feature labels in auth_ok, and to one that does not
// (the tier before labels) sends an announce that tier's strict decoder
// reads.
func TestAnnounceLabels(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"site": "paris", "example.com/rack": "r-12"}
	start := func(t *testing.T) (*tierConn, string) {
		rt := newRawTier(t, set)
		node := wire.NewNodeID()
		o := agent.MockOptions(node, set, 1)
		o.URLs, o.Token, o.Name, o.Labels = []string{rt.url}, "unchecked", "kitchen-pi", labels
		runStandalone(t, o)
		tc := rt.accept(t)
		tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
		tc.recv(t, wire.TypeAuth, nil)
		return tc, node
	}

	t.Run("tier offers labels", func(t *testing.T) {
		tc, node := start(t)
		tc.send(t, wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: tenant, SessionID: wire.NewMsgID(),
			ServerTimeMs: time.Now().UnixMilli(), Features: []string{wire.FeatureDeadlineAt, wire.FeatureLabels, "later"}})
		var a wire.Announce
		e := tc.recv(t, wire.TypeAnnounce, &a)
		if err := set.ValidateJSON(schemas.Manifest, e.Payload); err != nil {
			t.Fatalf("the manifest schema refuses the announce: %v", err)
		}
		if !slices.Equal(a.Features, []string{wire.FeatureDeadlineAt, wire.FeatureLabels}) || a.Name != "kitchen-pi" ||
			!maps.Equal(a.Labels, labels) {
			t.Fatalf("announce features %v name %q labels %v; want both features, the name and the labels",
				a.Features, a.Name, a.Labels)
		}
	})

	t.Run("tier before labels", func(t *testing.T) {
		tc, node := start(t)
		tc.send(t, wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: tenant, SessionID: wire.NewMsgID(),
			ServerTimeMs: time.Now().UnixMilli()})
		e := tc.recv(t, wire.TypeAnnounce, nil)
		// The announce as that tier decoded it: strictly, with no field
		// for a name or labels.
		var old struct {
			NodeID       string               `json:"node_id"`
			Agent        schemas.Agent        `json:"agent"`
			Capabilities []schemas.Capability `json:"capabilities"`
			Features     []string             `json:"features"`
		}
		dec := json.NewDecoder(bytes.NewReader(e.Payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&old); err != nil {
			t.Fatalf("announce %s does not decode as the tier before labels read it: %v", e.Payload, err)
		}
		if !slices.Equal(old.Features, []string{wire.FeatureDeadlineAt}) {
			t.Fatalf("features %v, want only %s", old.Features, wire.FeatureDeadlineAt)
		}
	})
}

// TestDeviceNameChecked: a device is not made with a name or labels its
// tier would refuse.
func TestDeviceNameChecked(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*agent.Options){
		"name":   func(o *agent.Options) { o.Name = "Kitchen Pi" },
		"labels": func(o *agent.Options) { o.Labels = map[string]string{"k": "-v"} },
	} {
		o := agent.MockOptions(wire.NewNodeID(), set, 1)
		o.URLs, o.Token = []string{"ws://127.0.0.1:1" + wire.Path}, "unchecked"
		edit(&o)
		if _, err := agent.New(o); err == nil {
			t.Errorf("%s: agent.New accepted %q %v", name, o.Name, o.Labels)
		}
	}
}

// TestHostName: the host's node name is one the rules accept, or none.
func TestHostName(t *testing.T) {
	if n := agent.HostName(); n != "" && !schemas.ValidNodeName(n) {
		t.Fatalf("HostName() = %q, not a node name", n)
	}
	if o := agent.HostOptions(wire.NewNodeID(), nil, "1"); o.Name != agent.HostName() {
		t.Fatalf("HostOptions name %q, want the host's %q", o.Name, agent.HostName())
	}
}
