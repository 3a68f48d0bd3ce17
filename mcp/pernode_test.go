package mcp

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// mockRecords returns n records of nodes announcing what a mock device
// announces (echo, metrics, a GPIO pin: five tools), each with its own
// capabilities, as the registry's decoder gives the gateway.
func mockRecords(n int) []*bus.Node {
	recs := make([]*bus.Node, n)
	for i := range recs {
		id := strings.ToLower(ulid.Make().String())
		recs[i] = &bus.Node{NodeID: id, Tenant: "demo", SessionID: "s" + id, Tier: "tier",
			Agent: schemas.Agent{Name: "okso-mock", Version: "1.0.0"},
			Capabilities: []schemas.Capability{
				{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput, Verbs: []string{"invoke"},
					SafetyClass: schemas.SafetyReadOnly},
				{CapID: "metrics", Kind: schemas.KindMetrics, SchemaRef: schemas.MetricsSubInput,
					Verbs: []string{"snapshot", "subscribe"}, SafetyClass: schemas.SafetyReadOnly},
				{CapID: "pin", Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput, Verbs: []string{"read", "write"},
					SafetyClass: schemas.SafetyMutating},
			}}
	}
	return recs
}

// BenchmarkCatalogPerNode reports what the device source and the catalog
// hold per listed node (B/node: the live heap's growth over 2,000 mock
// nodes listed, the records themselves excluded), so that the gateway's
// memory per node can be followed without a fleet.
func BenchmarkCatalogPerNode(b *testing.B) {
	const n = 2000
	var perNode float64
	for b.Loop() {
		b.StopTimer()
		d := listingDevices(b)
		recs := mockRecords(n)
		d.pending[recs[0].NodeID] = recs[0].SessionID
		d.list(recs[0]) // the verbs' templates and documents, shared by every node
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		for _, rec := range recs[1:] {
			d.pending[rec.NodeID] = rec.SessionID
			d.list(rec)
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := len(d.ids()); got != n {
			b.Fatalf("%d nodes listed, want %d", got, n)
		}
		perNode = float64(after.HeapAlloc-before.HeapAlloc) / (n - 1)
		runtime.KeepAlive(d)
		runtime.KeepAlive(recs)
		b.StartTimer()
	}
	b.ReportMetric(perNode, "B/node")
}

// TestCatalogNodes: a node's tools, held by node rather than by name,
// are listed and found by either name, for their tenant only (another
// tenant is told they are elsewhere), left out of lean views, leave with
// their node and move with it to another tenant; a tool whose name
// another owner's tool holds is refused whichever came first, and the
// node's other tools stay.
func TestCatalogNodes(t *testing.T) {
	d := listingDevices(t)
	c, refused := testCatalog(t)
	recs := mockRecords(2)
	for _, r := range recs[1:] {
		r.Tenant = "other"
	}
	a, b := recs[0], recs[1]
	c.putNode(d.project(a))
	c.putNode(d.project(b))
	echo := "sysecho." + a.NodeID + ".echo.invoke"
	full := view{tenant: "demo", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating), form: formSeed}
	want := []string{"gpio." + a.NodeID + ".pin.read", "gpio." + a.NodeID + ".pin.write",
		"sys." + a.NodeID + ".metrics.snapshot", "sys." + a.NodeID + ".metrics.subscribe", echo}
	if got := listedBy(t, c, full); !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
	ro := view{tenant: "demo", scopes: scopeBit(auth.ScopeReadOnly)}
	if got := listedBy(t, c, ro); len(got) != 4 || got[0] != "gpio-"+a.NodeID+"-pin-read" {
		t.Errorf("read-only view lists %v", got)
	}
	for _, name := range []string{echo, schemas.SafeToolName(echo)} {
		e, elsewhere := c.lookup("demo", name)
		if e == nil || e.name != echo || e.safe != schemas.SafeToolName(echo) || !e.perNode() || elsewhere != "" {
			t.Errorf("lookup %s: %+v, elsewhere %q", name, e, elsewhere)
		}
		if e, elsewhere := c.lookup("other", name); e != nil || elsewhere != echo {
			t.Errorf("another tenant's lookup of %s: %+v, elsewhere %q", name, e, elsewhere)
		}
	}
	for _, name := range []string{"sysecho." + a.NodeID + ".echo.nope", "sysecho-" + a.NodeID + ".echo.invoke", "sys." + a.NodeID + ".echo.invoke"} {
		if e, elsewhere := c.lookup("demo", name); e != nil || elsewhere != "" {
			t.Errorf("lookup %s: %+v, elsewhere %q", name, e, elsewhere)
		}
	}
	lean := full
	lean.lean = true
	if got := listedBy(t, c, lean); len(got) != 0 {
		t.Errorf("lean view lists %v", got)
	}

	// A tool of another owner whose name a node's tool holds is refused,
	// and the node's tool stays; then the other way round.
	up := testEntry(schemas.SafeToolName(echo), "read_only")
	up.origin.owner = "upstream/web"
	c.put("remote/web/*", anyTenant, []*entry{up})
	if len(*refused) != 1 {
		t.Fatalf("refused %v", *refused)
	}
	if e, _ := c.lookup("demo", echo); e == nil || !e.perNode() {
		t.Errorf("the node's tool went: %+v", e)
	}
	bEcho := "sysecho." + b.NodeID + ".echo.invoke"
	first := testEntry(bEcho, "read_only")
	first.origin.owner = "upstream/web"
	c.dropNode(b.NodeID)
	c.put("remote/web/other", "other", []*entry{first})
	c.putNode(d.project(b))
	if !slices.Equal((*refused)[1:], []string{bEcho + " by " + bEcho}) {
		t.Errorf("refused %v", *refused)
	}
	if e, _ := c.lookup("other", schemas.SafeToolName(bEcho)); e == nil || e.perNode() {
		t.Errorf("the first tool was replaced: %+v", e)
	}
	if got := listedBy(t, c, view{tenant: "other", scopes: scopeBit(auth.ScopeReadOnly)}); len(got) != 4 {
		t.Errorf("the node's other tools: %v", got)
	}

	// The node moves to another tenant, then leaves.
	moved := *a
	moved.Tenant = "third"
	c.putNode(d.project(&moved))
	if e, elsewhere := c.lookup("demo", echo); e != nil || elsewhere != echo {
		t.Errorf("after the move, demo finds %+v, elsewhere %q", e, elsewhere)
	}
	if got := listedBy(t, c, full); len(got) != 0 {
		t.Errorf("after the move, demo lists %v", got)
	}
	if e, _ := c.lookup("third", echo); e == nil {
		t.Error("the node's new tenant does not find it")
	}
	c.dropNode(a.NodeID)
	c.dropNode(a.NodeID) // twice: no-op
	if e, elsewhere := c.lookup("third", echo); e != nil || elsewhere != "" {
		t.Errorf("after the drop: %+v, elsewhere %q", e, elsewhere)
	}
}
