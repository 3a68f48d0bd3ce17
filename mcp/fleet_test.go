package mcp

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// fleetNodeID is the i-th test node's id.
func fleetNodeID(i int) string { return fmt.Sprintf("01hzx9k3m4p7q8r9s0t1v%05d", i) }

// testFleet lists n nodes of tenant demo (name mock-<i>, labels
// fleet=mock and zone a, b or c; an echo capability each, a metrics one
// on every even node; agent okso-mock but on every tenth, other-agent)
// and two of tenant other, then takes offline nodes 0 and 1 of demo
// and the first of other. The fleet tools are in the catalog.
func testFleet(t testing.TB, n int) (*fleet, *devices) {
	t.Helper()
	d := listingDevices(t)
	sh := d.feed.(*shelf)
	fl := &fleet{devices: d, cat: sh.catalog, form: formSafe}
	if err := addFleet(sh, fl, d.set); err != nil {
		t.Fatal(err)
	}
	echo := schemas.Capability{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
	metrics := schemas.Capability{CapID: "sys", Kind: schemas.KindMetrics, SchemaRef: schemas.MetricsSnapInput,
		Verbs: []string{"snapshot", "subscribe"}, SafetyClass: schemas.SafetyReadOnly}
	connected := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	add := func(i int, tenant string) *bus.Node {
		rec := &bus.Node{NodeID: fleetNodeID(i), Tenant: tenant, SessionID: fleetNodeID(90000 + i),
			Agent: schemas.Agent{Name: "okso-mock", Version: "1.0.0"}, ConnectedAt: connected,
			Capabilities: []schemas.Capability{echo}, Name: fmt.Sprintf("mock-%d", i),
			Labels: map[string]string{"fleet": "mock", "zone": string(rune('a' + i%3))}, State: bus.StateOnline}
		if i%2 == 0 {
			rec.Capabilities = append(rec.Capabilities, metrics)
		}
		if i%10 == 0 {
			rec.Agent.Name = "other-agent"
		}
		d.mu.Lock()
		d.pending[rec.NodeID] = rec.SessionID
		d.mu.Unlock()
		d.list(rec)
		return rec
	}
	var left []*bus.Node
	for i := range n {
		rec := add(i, "demo")
		if i < 2 {
			left = append(left, rec)
		}
	}
	left = append(left, add(n, "other"))
	add(n+1, "other")
	for _, rec := range left {
		off := *rec
		off.State, off.LastSeen = bus.StateOffline, connected.Add(time.Hour)
		d.left(&off, reasonDisconnect)
	}
	return fl, d
}

func tokenOf(tenant, scope, names string) *auth.Claims {
	return &auth.Claims{Tenant: tenant, Scope: scope, ToolNames: names}
}

// callFleet calls a fleet tool as its door would after the checks: the
// arguments must pass the tool's input schema, and the answer must pass
// its output schema.
func callFleet(t *testing.T, f *fleet, tool string, claims *auth.Claims, args string) json.RawMessage {
	t.Helper()
	e, _ := f.cat.lookup(claims.Tenant, tool)
	if e == nil {
		t.Fatalf("no tool %s for tenant %s", tool, claims.Tenant)
	}
	if err := e.input.validate([]byte(args)); err != nil {
		t.Fatalf("%s %s: %s", tool, args, e.input.explain(err))
	}
	out, env := e.invoker.(unaryCall)(t.Context(), &callCtx{claims: claims}, json.RawMessage(args))
	if env != nil {
		t.Fatalf("%s %s: %s %s", tool, args, env.Code, env.Message)
	}
	if err := e.output.validate(out); err != nil {
		t.Fatalf("%s %s answers %s: %s", tool, args, out, e.output.explain(err))
	}
	return out
}

// TestFleetNodesFilters: each filter, and several at once, select the
// nodes of the caller's tenant they say, in node id order, with total.
func TestFleetNodesFilters(t *testing.T) {
	f, _ := testFleet(t, 30)
	demo := tokenOf("demo", auth.ScopeReadOnly, "")
	ids := func(from, to int, keep func(i int) bool) []string {
		var out []string
		for i := from; i < to; i++ {
			if keep == nil || keep(i) {
				out = append(out, fleetNodeID(i))
			}
		}
		return out
	}
	for _, c := range []struct {
		name, args string
		want       []string
	}{
		{"none: every online node", `{}`, ids(2, 30, nil)},
		{"kind", `{"kind":"system.metrics"}`, ids(2, 30, func(i int) bool { return i%2 == 0 })},
		{"cap_id", `{"cap_id":"sys"}`, ids(2, 30, func(i int) bool { return i%2 == 0 })},
		{"verb", `{"verb":"snapshot"}`, ids(2, 30, func(i int) bool { return i%2 == 0 })},
		{"kind and verb of another capability", `{"kind":"system.echo","verb":"snapshot"}`, nil},
		{"agent", `{"agent":"other-agent"}`, ids(2, 30, func(i int) bool { return i%10 == 0 })},
		{"name", `{"name":"mock-7"}`, ids(7, 8, nil)},
		{"labels", `{"labels":{"zone":"b","fleet":"mock"}}`, ids(2, 30, func(i int) bool { return i%3 == 1 })},
		{"a label no node has", `{"labels":{"zone":"b","site":"lyon"}}`, nil},
		{"labels and kind", `{"labels":{"zone":"a"},"kind":"system.metrics"}`, ids(2, 30, func(i int) bool { return i%6 == 0 })},
		{"node_id_prefix", `{"node_id_prefix":"` + fleetNodeID(10)[:25] + `"}`, ids(10, 20, nil)},
		{"node_ids, one offline, one of another tenant", `{"node_ids":["` + fleetNodeID(5) + `","` + fleetNodeID(1) + `","` + fleetNodeID(31) + `"]}`, ids(5, 6, nil)},
		{"offline", `{"presence":"offline"}`, ids(0, 2, nil)},
		{"any", `{"presence":"any","name":"mock-1"}`, ids(1, 2, nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got nodesDoc
			if err := json.Unmarshal(callFleet(t, f, ToolFleetNodes, demo, c.args), &got); err != nil {
				t.Fatal(err)
			}
			var gotIDs []string
			for _, n := range got.Nodes {
				gotIDs = append(gotIDs, n.NodeID)
			}
			if !slices.Equal(gotIDs, c.want) || got.Total != len(c.want) || got.NextCursor != "" {
				t.Errorf("nodes %v, total %d, cursor %q; want %v", gotIDs, got.Total, got.NextCursor, c.want)
			}
		})
	}

	t.Run("what a node says", func(t *testing.T) {
		var got nodesDoc
		_ = json.Unmarshal(callFleet(t, f, ToolFleetNodes, demo, `{"presence":"any","node_ids":["`+fleetNodeID(0)+`","`+fleetNodeID(4)+`"]}`), &got)
		if len(got.Nodes) != 2 {
			t.Fatalf("%d nodes", len(got.Nodes))
		}
		off, on := got.Nodes[0], got.Nodes[1]
		if off.Presence != "offline" || off.LastSeen != "2026-11-27T13:00:00Z" || off.Name != "mock-0" || off.Agent.Name != "other-agent" {
			t.Errorf("offline node: %+v", off)
		}
		id := fleetNodeID(4)
		want := []string{"sys-" + id + "-sys-snapshot", "sys-" + id + "-sys-subscribe", "sysecho-" + id + "-echo-invoke"}
		slices.Sort(on.Tools)
		if on.Presence != "online" || on.LastSeen != "" || on.ConnectedAt != "2026-11-27T12:00:00Z" || on.Labels["zone"] != "b" ||
			!slices.Equal(on.Tools, want) {
			t.Errorf("online node: %+v, want tools %v", on, want)
		}
		var seed nodesDoc
		_ = json.Unmarshal(callFleet(t, f, ToolFleetNodes, tokenOf("demo", auth.ScopeReadOnly, auth.ToolNamesSeed), `{"node_ids":["`+id+`"]}`), &seed)
		if len(seed.Nodes) != 1 || !slices.Contains(seed.Nodes[0].Tools, "sysecho."+id+".echo.invoke") {
			t.Errorf("seed form: %+v", seed.Nodes)
		}
	})

	t.Run("tenant isolation", func(t *testing.T) {
		var got nodesDoc
		_ = json.Unmarshal(callFleet(t, f, ToolFleetNodes, tokenOf("other", auth.ScopeReadOnly, ""), `{"presence":"any"}`), &got)
		if got.Total != 2 || got.Nodes[0].NodeID != fleetNodeID(30) || got.Nodes[1].NodeID != fleetNodeID(31) {
			t.Errorf("tenant other sees %+v", got)
		}
		_ = json.Unmarshal(callFleet(t, f, ToolFleetNodes, tokenOf("nobody", auth.ScopeReadOnly, ""), `{"presence":"any"}`), &got)
		if got.Total != 0 || len(got.Nodes) != 0 {
			t.Errorf("a tenant without nodes sees %+v", got)
		}
	})
}

// TestFleetNodesPages: pages of limit nodes, each continuing after the
// last node id of the one before, cover every match once.
func TestFleetNodesPages(t *testing.T) {
	f, _ := testFleet(t, 250)
	demo := tokenOf("demo", auth.ScopeReadOnly, "")
	var seen []string
	cursor, pages := "", 0
	for {
		args := `{"limit":100,"labels":{"fleet":"mock"}}`
		if cursor != "" {
			args = `{"limit":100,"labels":{"fleet":"mock"},"cursor":"` + cursor + `"}`
		}
		var got nodesDoc
		_ = json.Unmarshal(callFleet(t, f, ToolFleetNodes, demo, args), &got)
		pages++
		if got.Total != 248 {
			t.Fatalf("page %d: total %d, want 248", pages, got.Total)
		}
		for _, n := range got.Nodes {
			seen = append(seen, n.NodeID)
		}
		if cursor = got.NextCursor; cursor == "" {
			break
		}
		if pages > 3 {
			t.Fatal("more than 3 pages")
		}
	}
	if pages != 3 || len(seen) != 248 || !slices.IsSorted(seen) || seen[0] != fleetNodeID(2) || len(slices.Compact(seen)) != 248 {
		t.Errorf("%d pages, %d nodes", pages, len(seen))
	}
}

// TestFleetArgumentsRefused: arguments outside the schemas are refused
// by the tools' input validators (E_MANIFEST_INVALID at every door), in
// words that name the argument.
func TestFleetArgumentsRefused(t *testing.T) {
	f, _ := testFleet(t, 1)
	for _, c := range []struct{ tool, args, word string }{
		{ToolFleetNodes, `{"limit":1001}`, "limit"},
		{ToolFleetNodes, `{"limit":0}`, "limit"},
		{ToolFleetNodes, `{"presence":"gone"}`, "presence"},
		{ToolFleetNodes, `{"cursor":"not-a-node"}`, "cursor"},
		{ToolFleetNodes, `{"labels":{"zone":7}}`, "labels"},
		{ToolFindTools, `{"limit":101}`, "limit"},
		{ToolFindTools, `{"source":"elsewhere"}`, "source"},
	} {
		e, _ := f.cat.lookup("demo", c.tool)
		err := e.input.validate([]byte(c.args))
		if err == nil {
			t.Errorf("%s %s: accepted", c.tool, c.args)
			continue
		}
		if why := e.input.explain(err); !strings.Contains(why, c.word) {
			t.Errorf("%s %s: %q does not name %s", c.tool, c.args, why, c.word)
		}
	}
	// A cursor of the right shape that is none of find_tools'.
	_, env := f.findTools(t.Context(), &callCtx{claims: tokenOf("demo", auth.ScopeReadOnly, "")}, json.RawMessage(`{"cursor":"AAAA"}`))
	if env == nil || env.Code != schemas.CodeManifestInvalid {
		t.Errorf("a foreign cursor: %v", env)
	}
}

// TestFindTools: a search finds tools by words of their name, title or
// description, best first; the same device tool on many nodes is one
// template hit; every source is searched, within the caller's view.
func TestFindTools(t *testing.T) {
	f, d := testFleet(t, 50)
	sh := d.feed.(*shelf)
	listen := testEntry("caller_tools_listen", schemas.SafetyMutating)
	listen.origin.source = sourceNameOkso
	sh.put("okso/caller", anyTenant, []*entry{listen})
	demo := tokenOf("demo", auth.ScopeReadOnly, "")
	find := func(t *testing.T, claims *auth.Claims, args string) findDoc {
		t.Helper()
		var got findDoc
		if err := json.Unmarshal(callFleet(t, f, ToolFindTools, claims, args), &got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	t.Run("a template per device tool", func(t *testing.T) {
		// The template first (echo in its name), then fleet.call (in
		// its description).
		got := find(t, demo, `{"query":"echo"}`)
		if got.Total != 2 || len(got.Tools) != 2 || got.Tools[1].Name != "fleet-call" {
			t.Fatalf("%+v", got)
		}
		h := got.Tools[0]
		if h.Template == nil || h.Template.Pattern != "sysecho-*-echo-invoke" || h.Template.Nodes != 48 || h.Template.Via != "fleet-call" ||
			h.Source != "device" || h.Kind != schemas.KindEcho || !strings.HasPrefix(h.Name, "sysecho-") || h.InputSchema == nil {
			t.Errorf("echo: %+v %+v", h, h.Template)
		}
		seed := find(t, tokenOf("demo", auth.ScopeReadOnly, auth.ToolNamesSeed), `{"query":"echo"}`)
		if len(seed.Tools) != 2 || seed.Tools[0].Template.Pattern != "sysecho.*.echo.invoke" || seed.Tools[0].Template.Via != "fleet.call" {
			t.Errorf("seed form: %+v", seed.Tools)
		}
		other := find(t, tokenOf("other", auth.ScopeReadOnly, ""), `{"query":"echo"}`)
		if len(other.Tools) != 2 || other.Tools[0].Template.Nodes != 1 {
			t.Errorf("tenant other: %+v", other.Tools)
		}
	})

	t.Run("lean token", func(t *testing.T) {
		// A lean list leaves the per-node tools out; find_tools searches
		// what the caller may call, and fleet.nodes names every tool.
		no := false
		lean := tokenOf("demo", auth.ScopeReadOnly, "")
		lean.NodeTools = &no
		got := find(t, lean, `{"query":"echo"}`)
		if len(got.Tools) != 2 || got.Tools[0].Template == nil || got.Tools[0].Template.Nodes != 48 {
			t.Errorf("echo for a lean token: %+v", got.Tools)
		}
		var nodes nodesDoc
		if err := json.Unmarshal(callFleet(t, f, ToolFleetNodes, lean, `{"limit":1}`), &nodes); err != nil {
			t.Fatal(err)
		}
		if len(nodes.Nodes) != 1 || len(nodes.Nodes[0].Tools) == 0 {
			t.Errorf("fleet.nodes for a lean token: %+v", nodes.Nodes)
		}
	})

	t.Run("a word of a description", func(t *testing.T) {
		got := find(t, demo, `{"query":"WITHOUT reaching"}`)
		if len(got.Tools) == 0 || got.Tools[0].Name != "fleet-nodes" || got.Tools[0].Source != "okso" || got.Tools[0].OutputSchema == nil {
			t.Errorf("%+v", got.Tools)
		}
	})

	t.Run("rank: every word, then the name", func(t *testing.T) {
		got := find(t, demo, `{"query":"metrics snapshot"}`)
		if len(got.Tools) < 2 || got.Tools[0].Template == nil || got.Tools[0].Template.Pattern != "sys-*-sys-snapshot" {
			t.Fatalf("%+v", got.Tools)
		}
	})

	t.Run("by source and kind", func(t *testing.T) {
		got := find(t, demo, `{"source":"okso"}`)
		var names []string
		for _, h := range got.Tools {
			names = append(names, h.Name)
		}
		// caller_tools_listen needs tools:call:mutating: not in this view.
		if !slices.Equal(names, []string{"fleet-call", "fleet-nodes", "okso-find_tools"}) {
			t.Errorf("okso's: %v", names)
		}
		got = find(t, tokenOf("demo", auth.ScopeMutating, ""), `{"source":"okso"}`)
		if got.Total != 4 {
			t.Errorf("okso's for a mutating token: %d", got.Total)
		}
		got = find(t, demo, `{"kind":"system.metrics"}`)
		if got.Total != 2 {
			t.Errorf("kind system.metrics: %+v", got.Tools)
		}
	})

	t.Run("pages", func(t *testing.T) {
		all := find(t, demo, `{}`)
		var paged []string
		cursor := ""
		for range 10 {
			args := `{"limit":1}`
			if cursor != "" {
				args = `{"limit":1,"cursor":"` + cursor + `"}`
			}
			got := find(t, demo, args)
			for _, h := range got.Tools {
				paged = append(paged, h.Name)
			}
			if cursor = got.NextCursor; cursor == "" {
				break
			}
		}
		var want []string
		for _, h := range all.Tools {
			want = append(want, h.Name)
		}
		if all.Total != 6 || !slices.Equal(paged, want) {
			t.Errorf("paged %v, want %v (total %d)", paged, want, all.Total)
		}
	})
}

// BenchmarkFleetNodes answers a page of 1,000 of 10,000 nodes.
func BenchmarkFleetNodes(b *testing.B) {
	f, _ := testFleet(b, 10000)
	c := &callCtx{claims: tokenOf("demo", auth.ScopeReadOnly, "")}
	args := json.RawMessage(`{"limit":1000,"labels":{"fleet":"mock"}}`)
	for b.Loop() {
		if _, env := f.nodes(b.Context(), c, args); env != nil {
			b.Fatal(env)
		}
	}
}

// BenchmarkFindTools searches the 30,000 tools of 10,000 nodes.
func BenchmarkFindTools(b *testing.B) {
	f, _ := testFleet(b, 10000)
	c := &callCtx{claims: tokenOf("demo", auth.ScopeReadOnly, "")}
	args := json.RawMessage(`{"query":"metrics snapshot"}`)
	for b.Loop() {
		if _, env := f.findTools(b.Context(), c, args); env != nil {
			b.Fatal(env)
		}
	}
}

// BenchmarkFindToolsAfterChange searches the 30,000 tools of 10,000
// nodes right after a change of the tenant's tools: the view's list and
// its index are made again.
func BenchmarkFindToolsAfterChange(b *testing.B) {
	f, _ := testFleet(b, 10000)
	c := &callCtx{claims: tokenOf("demo", auth.ScopeReadOnly, "")}
	args := json.RawMessage(`{"query":"metrics snapshot"}`)
	for b.Loop() {
		f.cat.mu.Lock()
		f.cat.changed("demo")
		f.cat.mu.Unlock()
		if _, env := f.findTools(b.Context(), c, args); env != nil {
			b.Fatal(env)
		}
	}
}
