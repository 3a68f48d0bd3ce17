package mcp

import (
	"slices"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
)

func testEntry(name, class string) *entry {
	return &entry{name: name, class: class, scope: auth.ScopeFor(class),
		desc: &sdk.Tool{Name: name, InputSchema: &jsonschema.Schema{Type: "object"}}}
}

// listedBy returns the names a view's server lists, through a real client.
func listedBy(t *testing.T, c *catalog, v view) []string {
	t.Helper()
	ct, st := sdk.NewInMemoryTransports()
	ss, err := c.server(v).Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var names []string
	for tl, err := range cs.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

// TestCatalog: a source's key owns what it put; putting again replaces it
// (in lookups and in every view, made before or after), dropping removes
// it; a name held by another tenant is told apart from no tool at all;
// views list only what their scopes allow.
func TestCatalog(t *testing.T) {
	c := newCatalog(func() *sdk.Server { return sdk.NewServer(&sdk.Implementation{Name: "t", Version: "1"}, nil) })
	ro := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly)}
	rw := view{tenant: "a", scopes: scopeBit(auth.ScopeReadOnly) | scopeBit(auth.ScopeMutating)}
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
	if e, elsewhere := c.lookup("a", "x.2.read"); e != nil || !elsewhere {
		t.Errorf("another tenant's tool: %+v elsewhere %v, want none, elsewhere", e, elsewhere)
	}
	if e, elsewhere := c.lookup("a", "nope"); e != nil || elsewhere {
		t.Errorf("no tool: %+v elsewhere %v", e, elsewhere)
	}

	// Put again: the key's tools are replaced, in views made before.
	c.put("node/1", "a", []*entry{testEntry("x.1.read", "read_only"), testEntry("x.1.more", "read_only")})
	if got := listedBy(t, c, rw); !slices.Equal(got, []string{"x.1.more", "x.1.read"}) {
		t.Errorf("after put again: %v", got)
	}
	if e, _ := c.lookup("a", "x.1.write"); e != nil {
		t.Errorf("x.1.write still looked up after its key replaced it: %+v", e)
	}

	c.drop("node/1")
	c.drop("node/1") // twice: no-op
	if got := listedBy(t, c, rw); len(got) != 0 {
		t.Errorf("after drop: %v", got)
	}
	if e, elsewhere := c.lookup("a", "x.1.read"); e != nil || elsewhere {
		t.Errorf("dropped tool: %+v elsewhere %v", e, elsewhere)
	}
	if e, _ := c.lookup("b", "x.2.read"); e == nil {
		t.Error("another key's tool went with the drop")
	}
	// A view made after the changes starts from the catalog as it is.
	fresh := view{tenant: "b", scopes: scopeBit(auth.ScopeReadOnly)}
	if got := listedBy(t, c, fresh); !slices.Equal(got, []string{"x.2.read"}) {
		t.Errorf("a new view lists %v", got)
	}
}
