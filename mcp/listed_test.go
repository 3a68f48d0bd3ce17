package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// listingDevices is a device source that follows no registry.
func listingDevices(t testing.TB) *devices {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	cat, _ := testCatalog(t)
	return newDevices(nil, nil, set, &toolDocs{set: set, log: log}, func() *schemas.KindTable { return nil }, &shelf{catalog: cat, log: log}, log, func(string) {})
}

// TestListedSchemas: every schema a device tool carries is listed as its
// embedded document, compact, which the SDK's schema type reads back to
// the same value.
func TestListedSchemas(t *testing.T) {
	d := listingDevices(t)
	n := 0
	for _, kind := range []string{schemas.KindEcho, schemas.KindMetrics, schemas.KindGPIO} {
		k, ok := schemas.LookupKind(kind)
		if !ok {
			t.Fatalf("no kind %s", kind)
		}
		for _, v := range k.Verbs {
			for _, id := range []string{v.Input, v.Output, v.Result} {
				if id == "" {
					continue
				}
				doc := d.docs.get(id)
				raw, _ := d.set.Raw(id)
				var compact bytes.Buffer
				if err := json.Compact(&compact, raw); err != nil || !bytes.Equal(doc, compact.Bytes()) {
					t.Fatalf("%s: listed %s, want the embedded document", id, doc)
				}
				s := new(jsonschema.Schema)
				if err := json.Unmarshal(doc, s); err != nil {
					t.Fatalf("%s: the SDK's schema type does not read it: %v", id, err)
				}
				back, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				var a, b any
				if json.Unmarshal(doc, &a) != nil || json.Unmarshal(back, &b) != nil || !reflect.DeepEqual(a, b) {
					t.Errorf("%s:\nlisted   %s\nSDK type %s", id, doc, back)
				}
				n++
			}
		}
	}
	if n < 8 {
		t.Fatalf("checked %d schemas", n)
	}
}

// BenchmarkListPage answers and encodes one page of 1,000 device tools.
func BenchmarkListPage(b *testing.B) {
	d := listingDevices(b)
	c, _ := testCatalog(nil)
	in, out := d.docs.get(schemas.EchoInput), d.docs.get(schemas.EchoOutput)
	entries := make([]*entry, 1000)
	for i := range entries {
		name := fmt.Sprintf("sysecho.n%05d.echo.invoke", i)
		entries[i] = &entry{name: name, scope: auth.ScopeReadOnly, origin: &origin{}, desc: &sdk.Tool{Name: name, Title: "Echo a message (node n)",
			Description: "system.echo invoke on node n. Safety class: read_only.", InputSchema: in, OutputSchema: out,
			Annotations: &sdk.ToolAnnotations{Title: "Echo a message", ReadOnlyHint: true, IdempotentHint: true},
			Meta:        sdk.Meta{"io.okso/node_id": "n", "io.okso/kind": "system.echo", "io.okso/safety_class": "read_only"}}}
	}
	c.put("k", "a", entries)
	v := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly)}
	// As the SDK writes it (encoding/json checks the page's JSON), and as
	// the fast path does (as it is).
	for _, door := range []string{"sdk", "fast"} {
		b.Run("door="+door, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				page, err := c.page(v, "")
				if err != nil {
					b.Fatal(err)
				}
				if door == "sdk" {
					_, err = json.Marshal(page)
				} else {
					_, err = page.MarshalJSON()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestProjectRecord: the gateway lists a node's tools exactly as
// schemas.Project, the tier's projection, names them, and none of a
// record the tier would have refused.
func TestProjectRecord(t *testing.T) {
	d := listingDevices(t)
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	echo := schemas.Capability{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
	pin := schemas.Capability{CapID: "pin", Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput,
		Verbs: []string{"read", "write"}, SafetyClass: schemas.SafetyMutating}
	rec := &bus.Node{NodeID: node, Tenant: "demo", Capabilities: []schemas.Capability{echo, pin}}
	tools, err := schemas.Project(node, rec.Capabilities)
	if err != nil {
		t.Fatal(err)
	}
	entries := d.project(rec).entries()
	if len(entries) != len(tools) {
		t.Fatalf("%d entries for %d projected tools", len(entries), len(tools))
	}
	for i, e := range entries {
		if e.name != tools[i].Name || e.class != tools[i].Class || e.tool(formSeed).Name != e.name ||
			e.origin.nodeID != node || e.invoker.(*nodeTool).hop().subject != bus.NodeCmd(node) {
			t.Errorf("entry %d = %s (%s), want %s (%s)", i, e.name, e.class, tools[i].Name, tools[i].Class)
		}
	}

	unknown := echo
	unknown.CapID, unknown.Kind = "shell", "system.shell"
	rec.Capabilities = append(rec.Capabilities, unknown)
	if entries := d.project(rec).entries(); entries != nil {
		t.Errorf("a record with an unknown kind lists %d tools; the tier refuses such a manifest", len(entries))
	}
}

// BenchmarkListNodes answers and encodes a page of the tools of 10,000
// nodes (30,000 tools: an echo, and a pin's read and write, each): at
// rest (nothing changed since the page before), and while the fleet
// churns (a node reconnects before each page, as at scale one always
// does somewhere).
func BenchmarkListNodes(b *testing.B) {
	d := listingDevices(b)
	c := d.feed.(*shelf).catalog
	echo := schemas.Capability{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
	pin := schemas.Capability{CapID: "pin", Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput,
		Verbs: []string{"read", "write"}, SafetyClass: schemas.SafetyMutating}
	recs := make([]*bus.Node, 10000)
	for i := range recs {
		recs[i] = &bus.Node{NodeID: fmt.Sprintf("01hzx9k3m4p7q8r9s0t1v%05d", i), Tenant: "demo", Capabilities: []schemas.Capability{echo, pin}}
		c.putNode(d.project(recs[i]))
	}
	v := view{tenant: "demo", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating), form: formSafe}
	first, err := c.page(v, "")
	if err != nil || len(first.listed(b)) != pageSize {
		b.Fatalf("first page: %d tools, %v", len(first.listed(b)), err)
	}
	cursor := first.NextCursor // page 2 of 30
	for _, churn := range []bool{false, true} {
		b.Run(fmt.Sprintf("churn=%v", churn), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if churn {
					c.putNode(d.project(recs[i%len(recs)]))
					i++
				}
				page, err := c.page(v, cursor)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := json.Marshal(page); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestListWith: a list brought forward from a view's last one as nodes
// come, change, go and move between tenants (toolList.with) is the list
// made from all of the tools, name for name and tool for tool, whatever
// else changes in between (an upstream's tools, which make it again).
func TestListWith(t *testing.T) {
	d := listingDevices(t)
	c := d.feed.(*shelf).catalog
	rnd := rand.New(rand.NewPCG(1, 2))
	echo := schemas.Capability{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
	pin := schemas.Capability{CapID: "pin", Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput,
		Verbs: []string{"read", "write"}, SafetyClass: schemas.SafetyMutating}
	views := []view{
		{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly), form: formSafe},
		{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating), form: formSeed},
		{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly), lean: true},
		{tenant: "b", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating), form: formSafe},
	}
	withs := 0
	for step := range 600 {
		id := fmt.Sprintf("01hzx9k3m4p7q8r9s0t1v%05d", rnd.IntN(40))
		switch op := rnd.IntN(20); {
		case op < 12:
			caps := []schemas.Capability{echo}
			if rnd.IntN(2) == 0 {
				caps = append(caps, pin)
			}
			tenant := "a"
			if rnd.IntN(5) == 0 {
				tenant = "b"
			}
			c.putNode(d.project(&bus.Node{NodeID: id, Tenant: tenant, Capabilities: caps}))
		case op < 19:
			c.dropNode(id)
		default:
			name := fmt.Sprintf("up%d.t", rnd.IntN(3))
			c.put("up/"+name, "a", []*entry{{name: name, safe: schemas.SafeToolName(name), scope: auth.ScopeReadOnly, origin: &origin{source: sourceNameUpstream, owner: "up"},
				listed: [formCount]*sdk.Tool{{Name: name}, {Name: schemas.SafeToolName(name)}}}})
		}
		if rnd.IntN(3) > 0 {
			continue // several changes between two lists, at times
		}
		for _, v := range views {
			c.mu.RLock()
			j := c.journal[v.tenant]
			_, bringable := j.since(c.last[v].genOr(^uint64(0)))
			c.mu.RUnlock()
			if bringable && c.last[v] != nil && c.lists[v] == nil {
				withs++
			}
			got := c.list(v)
			c.mu.RLock()
			want := c.made(v)
			if len(got.names) != len(want.names) {
				t.Fatalf("step %d, view %+v: %d tools listed, %d made from all", step, v, len(got.names), len(want.names))
			}
			for i := range got.names {
				if got.names[i] != want.names[i] || got.entries[i].name != want.entries[i].name || got.entries[i].origin != want.entries[i].origin {
					t.Fatalf("step %d, view %+v: tool %d is %s, made from all %s", step, v, i, got.names[i], want.names[i])
				}
			}
		}
	}
	if withs < 50 {
		t.Errorf("%d lists were brought forward, want many", withs)
	}
}

// genOr is the list's gen, or or for none.
func (l *toolList) genOr(or uint64) uint64 {
	if l == nil {
		return or
	}
	return l.gen
}

// TestPagesStable: a page's tools are encoded once and answered from the
// page cache while they stay the same; a node that comes or goes makes
// only the pages its tools are on again, not those after them; pages
// that grow past pageSize are split, and every page of a view, followed
// by its cursors, lists each tool of the view once, in order.
func TestPagesStable(t *testing.T) {
	d := listingDevices(t)
	c := d.feed.(*shelf).catalog
	echo := schemas.Capability{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
	node := func(i int) *bus.Node {
		return &bus.Node{NodeID: fmt.Sprintf("01hzx9k3m4p7q8r9s0t1v%05d", i), Tenant: "demo", Capabilities: []schemas.Capability{echo}}
	}
	for i := 0; i < 10000; i += 2 {
		c.putNode(d.project(node(i)))
	}
	v := view{tenant: "demo", scopes: scopeBit(auth.ScopeReadOnly), form: formSafe}
	// walk lists every page and checks them against the list made from
	// all; it returns the pages' cursors.
	walk := func() []string {
		t.Helper()
		var names, cursors []string
		for cursor := ""; ; {
			cursors = append(cursors, cursor)
			page, err := c.page(v, cursor)
			if err != nil {
				t.Fatal(err)
			}
			tools := page.listed(t)
			if len(tools) == 0 || len(tools) > pageSize {
				t.Fatalf("a page of %d tools", len(tools))
			}
			for _, tl := range tools {
				names = append(names, tl.Name)
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		c.mu.RLock()
		want := c.made(v)
		if !slices.Equal(names, want.names) {
			t.Fatalf("the pages list %d tools, %d made from all", len(names), len(want.names))
		}
		return cursors
	}
	before := walk()
	if len(before) != 5 {
		t.Fatalf("%d pages of 5,000 tools", len(before))
	}
	encoded := c.pages.encoded
	if walk(); c.pages.encoded != encoded {
		t.Errorf("listed again unchanged, %d pages were encoded again", c.pages.encoded-encoded)
	}
	// kept reports whether every bound of was is one of now.
	kept := func(now, was []string) bool {
		for _, c := range was {
			if !slices.Contains(now, c) {
				return false
			}
		}
		return true
	}
	// A node comes on page 3, full: it is split in two, the others stay.
	c.putNode(d.project(node(5001)))
	encoded = c.pages.encoded
	after := walk()
	if len(after) != 6 || !kept(after, before) || c.pages.encoded != encoded+2 {
		t.Errorf("a node came: %d pages, %d encoded again (cursors %v, were %v)", len(after), c.pages.encoded-encoded, after, before)
	}
	// It goes: the half it was on only.
	c.dropNode(fmt.Sprintf("01hzx9k3m4p7q8r9s0t1v%05d", 5001))
	encoded = c.pages.encoded
	if now := walk(); !slices.Equal(now, after) || c.pages.encoded != encoded+1 {
		t.Errorf("a node went: %d pages encoded again (cursors %v, were %v)", c.pages.encoded-encoded, now, after)
	}
	// Page 2 grows by 300 tools: split in two, the others stay.
	for i := 2001; i < 2600; i += 2 {
		c.putNode(d.project(node(i)))
	}
	encoded = c.pages.encoded
	if now := walk(); len(now) != 7 || !kept(now, after) || c.pages.encoded != encoded+2 {
		t.Errorf("page 2 grew: %d pages, %d encoded again (cursors %v, were %v)", len(now), c.pages.encoded-encoded, now, after)
	}
}

// TestListedPageJSON: a page is written as the SDK writes the same
// ListToolsResult, with the fields the SDK sets after okso answers.
func TestListedPageJSON(t *testing.T) {
	tools := []*sdk.Tool{{Name: "a", InputSchema: json.RawMessage(`{"type":"object"}`)}, {Name: "b<>", Description: "x & y"}}
	body, err := json.Marshal(tools)
	if err != nil {
		t.Fatal(err)
	}
	for _, next := range []string{"", "bmV4dA"} {
		p := &listedPage{ListToolsResult: &sdk.ListToolsResult{NextCursor: next}, tools: body}
		p.SetMeta(map[string]any{"io.modelcontextprotocol/serverInfo": map[string]any{"name": "okso"}})
		p.CacheScope = "private"
		want := *p.ListToolsResult
		want.Tools = tools
		got, err := json.Marshal(p)
		w, _ := json.Marshal(&want)
		if err != nil || !bytes.Equal(got, w) {
			t.Errorf("page\n%s, %v\nSDK\n%s", got, err, w)
		}
	}
}
