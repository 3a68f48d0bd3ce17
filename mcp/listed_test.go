package mcp

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

func listingGateway(t testing.TB) *Gateway {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	return &Gateway{o: Options{Schemas: set}, log: slog.New(slog.DiscardHandler),
		toolSchemas: map[string]*jsonschema.Schema{}, listedSchemas: map[*jsonschema.Schema]json.RawMessage{},
		changedCh: make(chan struct{})}
}

// TestListedSchemas: every schema a tool carries is written by tools/list
// as the same JSON value the SDK's schema type encodes to.
func TestListedSchemas(t *testing.T) {
	g := listingGateway(t)
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
				s := g.toolSchema(id)
				want, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				page := &sdk.ListToolsResult{Tools: []*sdk.Tool{{Name: "t", InputSchema: s, OutputSchema: s}}}
				g.listed(page)
				in, inOK := page.Tools[0].InputSchema.(json.RawMessage)
				out, outOK := page.Tools[0].OutputSchema.(json.RawMessage)
				if !inOK || !outOK || in == nil || out == nil {
					t.Fatalf("%s: listed without its document", id)
				}
				got, err := json.Marshal(page.Tools[0].InputSchema)
				if err != nil {
					t.Fatal(err)
				}
				var a, b any
				if json.Unmarshal(want, &a) != nil || json.Unmarshal(got, &b) != nil || !reflect.DeepEqual(a, b) {
					t.Errorf("%s:\nSDK type %s\nlisted   %s", id, want, got)
				}
				n++
			}
		}
	}
	if n < 8 {
		t.Fatalf("checked %d schemas", n)
	}
}

// BenchmarkListPage encodes a page of 1,000 tools as the SDK holds them
// (schemas) and as tools/list writes them (documents).
func BenchmarkListPage(b *testing.B) {
	g := listingGateway(b)
	in, out := g.toolSchema(schemas.EchoInput), g.toolSchema(schemas.EchoOutput)
	tools := make([]*sdk.Tool, 1000)
	for i := range tools {
		tools[i] = &sdk.Tool{Name: fmt.Sprintf("sysecho.n%05d.echo.invoke", i), Title: "Echo a message (node n)",
			Description: "system.echo invoke on node n. Safety class: read_only.", InputSchema: in, OutputSchema: out,
			Annotations: &sdk.ToolAnnotations{Title: "Echo a message", ReadOnlyHint: true, IdempotentHint: true},
			Meta:        sdk.Meta{"io.okso/node_id": "n", "io.okso/kind": "system.echo", "io.okso/safety_class": "read_only"}}
	}
	for _, docs := range []bool{false, true} {
		name := "schemas"
		if docs {
			name = "documents"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				page := &sdk.ListToolsResult{Tools: append([]*sdk.Tool(nil), tools...)}
				if docs {
					g.listed(page)
				}
				if _, err := json.Marshal(page); err != nil {
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
	g := listingGateway(t)
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
	entries := g.project(rec)
	if len(entries) != len(tools) {
		t.Fatalf("%d entries for %d projected tools", len(entries), len(tools))
	}
	for i, e := range entries {
		if e.name != tools[i].Name || e.class != tools[i].Class || e.desc.Name != e.name ||
			e.nodeID != node || e.subject != bus.NodeCmd(node) {
			t.Errorf("entry %d = %s (%s), want %s (%s)", i, e.name, e.class, tools[i].Name, tools[i].Class)
		}
	}

	unknown := echo
	unknown.CapID, unknown.Kind = "shell", "system.shell"
	rec.Capabilities = append(rec.Capabilities, unknown)
	if entries := g.project(rec); entries != nil {
		t.Errorf("a record with an unknown kind lists %d tools; the tier refuses such a manifest", len(entries))
	}
}
