package roles

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// TestToolDescriptionNamesAndLabels: an MCP client (the Go SDK's) of an
// all-in-one reads each device tool's description as the server's
// template with the node's name and labels: a device's own name and
// labels under its operator's (the token's claim, then the tier's
// --node-labels file, key by key), and the simulated devices' mock-<i>
// with fleet and zone labels.
func TestToolDescriptionNamesAndLabels(t *testing.T) {
	node := wire.NewNodeID()
	file := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(file, []byte("# the operator's word\nnodes:\n  "+node+":\n    labels:\n      zone: file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startAllInOne(t, 2, func(c *AllInOneConfig) { c.Tier.NodeLabels = file })

	// okso token mint --device --label: the claim the tier reads.
	var tok, errOut bytes.Buffer
	root := NewRoot(&tok, &errOut)
	root.SetArgs([]string{"token", "mint", "--data-dir", f.a.c.dataDir, "--device", "--node-id", node,
		"--label", "owner=ops", "--label", "zone=token"})
	if err := root.Execute(); err != nil {
		t.Fatalf("token mint: %v (%s)", err, errOut.String())
	}
	o := agent.MockOptions(node, f.a.c.schemas, 1)
	o.URLs, o.Token = []string{f.a.DeviceURL()}, strings.TrimSpace(tok.String())
	o.Name, o.Labels = "kitchen-pi", map[string]string{"zone": "device", "role": "edge", "owner": "device"}
	d, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	f.waitNodes(DefaultTenant, 3)

	s := f.client(f.token(auth.MintOptions{}), "2025-11-25")
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	descs := map[string]string{} // echo tools' descriptions by node id
	for _, tl := range list.Tools {
		if strings.HasPrefix(tl.Name, "sysecho-") {
			descs[nodeOf(tl)] = tl.Description
		}
	}
	want := "Echo a message on node kitchen-pi (" + node + "), labels owner=ops, role=edge, zone=file. Safety class: read_only."
	if descs[node] != want {
		t.Errorf("description of the labelled node:\n got %q\nwant %q", descs[node], want)
	}
	mocks := map[string]bool{}
	for id, d := range descs {
		if id == node {
			continue
		}
		for m, zone := range map[string]string{"mock-0": "a", "mock-1": "b"} {
			if d == "Echo a message on node "+m+" ("+id+"), labels fleet=mock, zone="+zone+". Safety class: read_only." {
				mocks[m] = true
			}
		}
	}
	if len(mocks) != 2 {
		t.Errorf("simulated devices' descriptions %v, want mock-0 and mock-1 with fleet and zone labels", descs)
	}

	// The registry record carries the same, for the fleet tools to come.
	reg, err := bus.OpenRegistry(t.Context(), f.nc, bus.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := reg.Get(t.Context(), node)
	if err != nil || rec.Name != "kitchen-pi" || !maps.Equal(rec.Labels, map[string]string{"owner": "ops", "role": "edge", "zone": "file"}) {
		t.Errorf("registry record %+v, %v", rec, err)
	}
}

// TestNodeLabelsFile: the tier's --node-labels file is read strictly,
// errors naming the line, and its settings are the tier's.
func TestNodeLabelsFile(t *testing.T) {
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	write := func(t *testing.T, text string) string {
		p := filepath.Join(t.TempDir(), "nodes.yaml")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := loadNodeLabels(write(t, "nodes:\n  "+node+":\n    name: kitchen-pi\n    labels:\n      example.com/rack: r12\n      spare:\n"))
	want := map[string]tier.NodeSettings{node: {Name: "kitchen-pi", Labels: map[string]string{"example.com/rack": "r12", "spare": ""}}}
	if err != nil || len(got) != 1 || got[node].Name != want[node].Name || !maps.Equal(got[node].Labels, want[node].Labels) {
		t.Fatalf("loadNodeLabels = %+v, %v; want %+v", got, err, want)
	}
	// JSON is YAML.
	if got, err := loadNodeLabels(write(t, `{"nodes":{"`+node+`":{"labels":{"site":"paris"}}}}`)); err != nil || got[node].Labels["site"] != "paris" {
		t.Fatalf("JSON file: %+v, %v", got, err)
	}
	if got, err := loadNodeLabels(write(t, "# nothing yet\n")); err != nil || got != nil {
		t.Fatalf("a file of comments: %+v, %v; want no settings", got, err)
	}
	for _, c := range []struct{ text, want string }{
		{"node:\n  x: 1\n", `:1: unknown key "node"`},
		{"nodes:\n  not-a-node: {}\n", `:2: "not-a-node" is not a node id`},
		{"nodes:\n  " + node + ": {}\n  " + node + ": {}\n", ":3: node " + node + " is written twice"},
		{"nodes:\n  " + node + ":\n    lables: {a: b}\n", `:3: unknown key "lables"`},
		{"nodes:\n  " + node + ":\n    name: Kitchen\n", ":3: name: want"},
		{"nodes:\n  " + node + ":\n    labels:\n      Bad.com/k: v\n", `:4: label "Bad.com/k": label key prefix not a DNS subdomain`},
		{"nodes:\n  " + node + ":\n    labels:\n      k: -v\n", `:4: label "k": label value not`},
		{"nodes:\n  " + node + ":\n    labels: [a, b]\n", ":3: labels: want a mapping"},
		{"nodes: [\n", "not YAML"},
	} {
		if _, err := loadNodeLabels(write(t, c.text)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("file %q: %v, want an error with %q", c.text, err, c.want)
		}
	}
}

// TestLabelFlags: --label is checked where it is given: okso agent's
// and okso token mint's (a device token's only).
func TestLabelFlags(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "mint", "--label", "a=b"}, "--label is a device token's"},
		{[]string{"token", "mint", "--device", "--node-id", "01hzx9k3m4p7q8r9s0t1v2w3xy", "--label", "a"}, "want key=value"},
		{[]string{"token", "mint", "--device", "--node-id", "01hzx9k3m4p7q8r9s0t1v2w3xy", "--label", "a=b", "--label", "a=c"}, `key "a" given twice`},
		{[]string{"agent", "--connect", "ws://127.0.0.1:1" + wire.Path, "--name", "Kitchen"}, `--name "Kitchen"`},
		{[]string{"agent", "--connect", "ws://127.0.0.1:1" + wire.Path, "--label", "k=-v"}, "label value not"},
	} {
		var out bytes.Buffer
		root := NewRoot(&out, &out)
		root.SetArgs(append(c.args, "--data-dir", dir))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := root.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error with %q", c.args, err, c.want)
		}
	}
	// A good one: the claim is in the token.
	var out bytes.Buffer
	root := NewRoot(&out, &out)
	root.SetArgs([]string{"token", "mint", "--data-dir", dir, "--device", "--node-id", "01hzx9k3m4p7q8r9s0t1v2w3xy",
		"--label", "example.com/rack=r12", "--label", "spare="})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	c, err := auth.UnverifiedClaims(strings.Fields(out.String())[0])
	if err != nil || !maps.Equal(c.Labels, map[string]string{"example.com/rack": "r12", "spare": ""}) {
		t.Fatalf("minted claims %+v, %v", c, err)
	}
}

// TestLocalAgentNamedForHost: all-in-one's own agent announces this
// host's name, and its tools are described by it.
func TestLocalAgentNamedForHost(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.LocalAgent = true })
	f.waitNodes(DefaultTenant, 1)
	node := f.a.agent.d.NodeID()
	on := node
	if host := agent.HostName(); host != "" {
		on = host + " (" + node + ")"
	}
	s := f.client(f.token(auth.MintOptions{}), "")
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "Echo a message on node " + on + ". Safety class: read_only."
	for _, tl := range list.Tools {
		if tl.Name == listedName(echoName(node)) {
			if tl.Description != want {
				t.Fatalf("description %q, want %q", tl.Description, want)
			}
			return
		}
	}
	t.Fatalf("no echo tool of this host's node %s", node)
}
