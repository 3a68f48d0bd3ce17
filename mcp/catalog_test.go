package mcp

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

func testEntry(name, class string) *entry {
	return &entry{name: name, class: class, scope: auth.ScopeFor(class), origin: &origin{},
		desc: &sdk.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}}
}

func testCatalog(testing.TB) (*catalog, *[]string) {
	var refused []string
	c := newCatalog(func() *sdk.Server {
		return sdk.NewServer(&sdk.Implementation{Name: "t", Version: "1"},
			&sdk.ServerOptions{Capabilities: &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{ListChanged: true}}})
	}, func(e *entry, taken string) { refused = append(refused, e.name+" by "+taken) })
	return c, &refused
}

// listed decodes the page's tools.
func (p *listedPage) listed(t testing.TB) []*sdk.Tool {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var res sdk.ListToolsResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("a page does not decode: %v\n%s", err, b)
	}
	return res.Tools
}

// listedBy returns the names a view lists, following its pages.
func listedBy(t *testing.T, c *catalog, v view) []string {
	t.Helper()
	var names []string
	cursor := ""
	for {
		res, err := c.page(v, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range res.listed(t) {
			names = append(names, tl.Name)
		}
		if cursor = res.NextCursor; cursor == "" {
			return names
		}
	}
}

// listedFull returns the tools a view lists (its first page).
func listedFull(t *testing.T, c *catalog, v view) []*sdk.Tool {
	t.Helper()
	res, err := c.page(v, "")
	if err != nil {
		t.Fatal(err)
	}
	return res.listed(t)
}

// TestCatalog: a source's key owns what it put; putting again replaces it
// (in lookups and in every view's list, made before or after), dropping
// removes it; a name held by another tenant is told apart from no tool at
// all; views list only what their scopes allow.
func TestCatalog(t *testing.T) {
	c, _ := testCatalog(t)
	ro := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly), form: formSeed}
	rw := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating), form: formSeed}
	if got := listedBy(t, c, ro); len(got) != 0 {
		t.Fatalf("empty catalog lists %v", got)
	}

	c.put("node/1", "a", []*entry{testEntry("x.1.read", "read_only"), testEntry("x.1.write", "mutating")})
	c.put("node/2", "b", []*entry{testEntry("x.2.read", "read_only")})
	if got := listedBy(t, c, ro); !slices.Equal(got, []string{"x.1.read"}) {
		t.Errorf("read-only view lists %v", got)
	}
	if got := listedBy(t, c, rw); !slices.Equal(got, []string{"x.1.read", "x.1.write"}) {
		t.Errorf("read-write view lists %v", got)
	}
	if e, _ := c.lookup("a", "x.1.write"); e == nil || e.scope != auth.ScopeMutating {
		t.Errorf("lookup a x.1.write: %+v", e)
	}
	if e, elsewhere := c.lookup("a", "x.2.read"); e != nil || elsewhere != "x.2.read" {
		t.Errorf("another tenant's tool: %+v elsewhere %v, want none, elsewhere", e, elsewhere)
	}
	if e, elsewhere := c.lookup("a", "x-2-read"); e != nil || elsewhere != "x.2.read" {
		t.Errorf("another tenant's tool by its listed name: %+v elsewhere %q, want none, elsewhere its canonical name", e, elsewhere)
	}
	if e, elsewhere := c.lookup("a", "nope"); e != nil || elsewhere != "" {
		t.Errorf("no tool: %+v elsewhere %v", e, elsewhere)
	}

	// Put again: the key's tools are replaced, in lists made before.
	c.put("node/1", "a", []*entry{testEntry("x.1.read", "read_only"), testEntry("x.1.more", "read_only")})
	if got := listedBy(t, c, rw); !slices.Equal(got, []string{"x.1.more", "x.1.read"}) {
		t.Errorf("after put again: %v", got)
	}
	for _, name := range []string{"x.1.write", "x-1-write"} {
		if e, _ := c.lookup("a", name); e != nil {
			t.Errorf("%s still looked up after its key replaced it: %+v", name, e)
		}
	}

	c.drop("node/1")
	c.drop("node/1") // twice: no-op
	if got := listedBy(t, c, rw); len(got) != 0 {
		t.Errorf("after drop: %v", got)
	}
	if e, elsewhere := c.lookup("a", "x.1.read"); e != nil || elsewhere != "" {
		t.Errorf("dropped tool: %+v elsewhere %v", e, elsewhere)
	}
	if e, _ := c.lookup("b", "x.2.read"); e == nil {
		t.Error("another key's tool went with the drop")
	}
	fresh := view{tenant: "b", scopes: scopeBit(auth.ScopeReadOnly)}
	if got := listedBy(t, c, fresh); !slices.Equal(got, []string{"x-2-read"}) {
		t.Errorf("a new view lists %v", got)
	}
}

// TestCatalogNames: each tool is listed under its safe name by default and
// its canonical name in the seed form, is found by either, and a tool one
// of whose names another tool of the tenant holds is refused and said,
// whatever the order the two came in.
func TestCatalogNames(t *testing.T) {
	c, refused := testCatalog(t)
	dev := "sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke"
	c.put("node/1", "a", []*entry{testEntry(dev, "read_only")})
	c.put("okso/caller", anyTenant, []*entry{testEntry("caller_tools_listen", "mutating")})
	webTools := []*entry{
		testEntry("web.v1.search", "read_only"),
		testEntry("web.v1-search", "read_only"), // the same safe name: refused
		testEntry("web.get-sum", "read_only"),
	}
	for _, e := range webTools {
		e.origin.owner = "upstream/web"
	}
	c.put("remote/web/a", "a", webTools)
	safe := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating)}
	want := []string{"caller_tools_listen", "sysecho-01hzx9k3m4p7q8r9s0t1v2w3xy-echo-invoke", "web-get-sum", "web-v1-search"}
	if got := listedBy(t, c, safe); !slices.Equal(got, want) {
		t.Errorf("safe names %v, want %v", got, want)
	}
	for _, name := range listedBy(t, c, safe) {
		if !schemas.ValidListedName(name) {
			t.Errorf("listed %q, which agent hosts refuse", name)
		}
	}
	seed := safe
	seed.form = formSeed
	want = []string{"caller_tools_listen", dev, "web.get-sum", "web.v1.search"}
	if got := listedBy(t, c, seed); !slices.Equal(got, want) {
		t.Errorf("seed names %v, want %v", got, want)
	}
	for _, tl := range listedFull(t, c, safe) {
		if canonical, _ := tl.Meta[schemas.MetaName].(string); tl.Name != "caller_tools_listen" && schemas.SafeToolName(canonical) != tl.Name {
			t.Errorf("%s is listed with the canonical name %q", tl.Name, canonical)
		}
	}
	for _, name := range []string{dev, schemas.SafeToolName(dev), "web.v1.search", "web-v1-search", "caller_tools_listen"} {
		if e, _ := c.lookup("a", name); e == nil {
			t.Errorf("no tool found by %s", name)
		}
	}
	if e, _ := c.lookup("a", "web.v1-search"); e != nil {
		t.Errorf("the refused tool is found: %+v", e)
	}
	if !slices.Equal(*refused, []string{"web.v1-search by web-v1-search"}) {
		t.Errorf("refused %v", *refused)
	}

	// Another key's tool whose name a tool of the tenant holds (one of
	// every tenant's, here) is refused too, and the first stays.
	mine := testEntry("caller_tools_listen", "read_only")
	mine.origin.owner = "listen/x"
	c.put("caller/x", "a", []*entry{mine})
	if e, _ := c.lookup("a", "caller_tools_listen"); e == nil || e.scope != auth.ScopeMutating {
		t.Errorf("the first caller_tools_listen was replaced: %+v", e)
	}
	if len(*refused) != 2 {
		t.Errorf("refused %v", *refused)
	}
	// And a tool of every tenant whose name one tenant's tool holds.
	all := testEntry(dev, "read_only")
	all.origin.owner = "upstream/all"
	c.put("remote/all", anyTenant, []*entry{all})
	if len(*refused) != 3 {
		t.Errorf("refused %v", *refused)
	}
	// A source putting its tools under a new key before it drops the old
	// one (an upstream configured for every tenant now) is not refused.
	web := func() []*entry {
		e := testEntry("web.get-sum", "read_only")
		e.origin.owner = "upstream/web"
		return []*entry{e}
	}
	c.put("remote/web/*", anyTenant, web())
	c.drop("remote/web/a")
	if e, _ := c.lookup("b", "web-get-sum"); e == nil || len(*refused) != 3 {
		t.Errorf("web moved to every tenant: %+v, refused %v", e, *refused)
	}
}

// TestCatalogLean: a lean view's pages leave out the per-node tools, as
// their source recorded them (a device's), and keep okso's own, upstream
// and caller tools, whatever their names look like; the full view of the
// same tenant, scopes and form lists them all, each list cached apart and
// both remade after a change; a per-node tool is still looked up by
// either of its names.
func TestCatalogLean(t *testing.T) {
	c, _ := testCatalog(t)
	mk := func(name, source, owner string) *entry {
		e := testEntry(name, "read_only")
		e.origin.source, e.origin.owner = source, owner
		return e
	}
	c.put("okso/fleet", anyTenant, []*entry{mk("fleet.nodes", sourceNameOkso, "")})
	c.put("node/1", "a", []*entry{mk("sysecho.n1.echo.invoke", sourceNameDevice, "node/n1")})
	// An upstream tool whose name has a device tool's shape: its source,
	// not its name, says it is not per-node.
	c.put("remote/web/a", "a", []*entry{mk("web.n2.echo.invoke", sourceNameUpstream, "upstream/web")})
	c.put("caller/x", "a", []*entry{mk("ant_send", sourceNameCaller, "listen/x")})

	full := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly)}
	lean := full
	lean.lean = true
	wantFull := []string{"ant_send", "fleet-nodes", "sysecho-n1-echo-invoke", "web-n2-echo-invoke"}
	wantLean := []string{"ant_send", "fleet-nodes", "web-n2-echo-invoke"}
	for range 2 { // made, then from the cache
		if got := listedBy(t, c, full); !slices.Equal(got, wantFull) {
			t.Errorf("full view lists %v, want %v", got, wantFull)
		}
		if got := listedBy(t, c, lean); !slices.Equal(got, wantLean) {
			t.Errorf("lean view lists %v, want %v", got, wantLean)
		}
	}
	if c.list(full) == c.list(lean) {
		t.Error("the lean and the full view share one cached list")
	}
	for _, name := range []string{"sysecho.n1.echo.invoke", "sysecho-n1-echo-invoke"} {
		if e, _ := c.lookup("a", name); e == nil || !e.perNode() {
			t.Errorf("per-node tool by %s: %+v", name, e)
		}
	}

	// A change remakes both: a second node's tool is in the full list only.
	c.put("node/3", "a", []*entry{mk("sysecho.n3.echo.invoke", sourceNameDevice, "node/n3")})
	if got := listedBy(t, c, lean); !slices.Equal(got, wantLean) {
		t.Errorf("after a node came, lean view lists %v", got)
	}
	if got := listedBy(t, c, full); len(got) != len(wantFull)+1 {
		t.Errorf("after a node came, full view lists %v", got)
	}
}

// TestViewOfNodeTools: the gateway's setting decides whether a token's
// view is lean, unless its node_tools claim says, which wins either way.
func TestViewOfNodeTools(t *testing.T) {
	no, yes := false, true
	for _, c := range []struct {
		claim    *bool
		gateway  bool
		wantLean bool
	}{
		{nil, true, false},
		{nil, false, true},
		{&no, true, true},
		{&yes, false, false},
		{&no, false, true},
		{&yes, true, false},
	} {
		v := viewOf(&auth.Claims{Tenant: "a", NodeTools: c.claim}, formSafe, c.gateway)
		if v.lean != c.wantLean {
			t.Errorf("claim %v, gateway node tools %v: lean %v, want %v", c.claim, c.gateway, v.lean, c.wantLean)
		}
	}
}

// TestCatalogKeyMovesTenant: a key put again for another tenant (a node
// id freed and taken by another tenant) leaves the first tenant's list,
// and its sessions hear of it.
func TestCatalogKeyMovesTenant(t *testing.T) {
	c, _ := testCatalog(t)
	a := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly)}
	c.put("node/1", "a", []*entry{testEntry("x.n1.r", "read_only")})
	if got := listedBy(t, c, a); !slices.Equal(got, []string{"x-n1-r"}) {
		t.Fatalf("a lists %v", got)
	}
	heard := make(chan struct{}, 4)
	ct, st := sdk.NewInMemoryTransports()
	ss, err := c.server("a").Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, &sdk.ClientOptions{
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { heard <- struct{}{} },
	}).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	c.put("node/1", "b", []*entry{testEntry("x.n1.r", "read_only")})
	if got := listedBy(t, c, a); len(got) != 0 {
		t.Errorf("tenant a still lists %v", got)
	}
	if e, elsewhere := c.lookup("a", "x-n1-r"); e != nil || elsewhere != "x.n1.r" {
		t.Errorf("tenant a finds %+v, elsewhere %q", e, elsewhere)
	}
	select {
	case <-heard:
	case <-time.After(10 * time.Second):
		t.Error("tenant a's session heard nothing")
	}
}

// TestCatalogListsOnce: while a source moves its tools from one key to
// another (an upstream now configured for every tenant), a list names
// each tool once.
func TestCatalogListsOnce(t *testing.T) {
	c, _ := testCatalog(t)
	mk := func() []*entry {
		e := testEntry("web.get-sum", "read_only")
		e.origin.owner = "upstream/web"
		return []*entry{e}
	}
	c.put("remote/web/a", "a", mk())
	c.put("remote/web/*", anyTenant, mk())
	v := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly)}
	if got := listedBy(t, c, v); !slices.Equal(got, []string{"web-get-sum"}) {
		t.Errorf("listed %v", got)
	}
	c.drop("remote/web/a")
	if got := listedBy(t, c, v); !slices.Equal(got, []string{"web-get-sum"}) {
		t.Errorf("after the move, listed %v", got)
	}
}

// TestCatalogPages: a view's list comes in pages of pageSize, each
// following the last name of the one before, even across a change; a
// cursor that is not one is refused.
func TestCatalogPages(t *testing.T) {
	c, _ := testCatalog(t)
	var entries []*entry
	for i := range 2*pageSize + 10 {
		entries = append(entries, testEntry("t.n"+strconv.Itoa(10000+i), "read_only"))
	}
	c.put("k", "a", entries)
	v := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly)}
	first, err := c.page(v, "")
	if err != nil || len(first.listed(t)) != pageSize || first.NextCursor == "" {
		t.Fatalf("first page: %d tools, cursor %q, %v", len(first.listed(t)), first.NextCursor, err)
	}
	if first.CacheScope != "private" {
		t.Errorf("cache scope %q", first.CacheScope)
	}
	// A tool before the cursor goes: the next page starts where it would have.
	c.put("k", "a", entries[1:])
	second, err := c.page(v, first.NextCursor)
	if err != nil || len(second.listed(t)) != pageSize || second.listed(t)[0].Name != "t-n"+strconv.Itoa(10000+pageSize) {
		t.Fatalf("second page: %d tools from %s, %v", len(second.listed(t)), second.listed(t)[0].Name, err)
	}
	third, err := c.page(v, second.NextCursor)
	if err != nil || len(third.listed(t)) != 10 || third.NextCursor != "" {
		t.Fatalf("last page: %d tools, cursor %q, %v", len(third.listed(t)), third.NextCursor, err)
	}
	if got := listedBy(t, c, v); len(got) != 2*pageSize+9 {
		t.Errorf("listed %d", len(got))
	}
	for _, bad := range []string{"!", "=="} {
		if _, err := c.page(v, bad); err == nil {
			t.Errorf("cursor %q accepted", bad)
		}
	}
	empty, err := c.page(view{tenant: "none"}, "")
	if err != nil || empty.listed(t) == nil {
		t.Errorf("an empty view: %+v, %v", empty, err)
	}
}

// TestCatalogNotifies: a session of a tenant hears that its list changed
// when a source puts or drops its tools, and a session of another tenant
// does not.
func TestCatalogNotifies(t *testing.T) {
	c, _ := testCatalog(t)
	connect := func(tenant string) chan struct{} {
		ch := make(chan struct{}, 16)
		ct, st := sdk.NewInMemoryTransports()
		ss, err := c.server(tenant).Connect(t.Context(), st, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ss.Close() })
		cl := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, &sdk.ClientOptions{
			ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { ch <- struct{}{} },
		})
		cs, err := cl.Connect(t.Context(), ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return ch
	}
	a, b := connect("a"), connect("b")
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no list_changed after %s", what)
		}
	}
	c.put("node/1", "a", []*entry{testEntry("x.1.read", "read_only")})
	wait(a, "a put")
	c.drop("node/1")
	wait(a, "a drop")
	c.put("remote/all", anyTenant, []*entry{testEntry("u.x", "read_only")})
	wait(a, "a put for every tenant")
	wait(b, "a put for every tenant")
	select {
	case <-b:
		t.Error("tenant b heard of tenant a's changes")
	default:
	}
}
