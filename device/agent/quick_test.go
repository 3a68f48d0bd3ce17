package agent

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestQuickHandlers: the package's own echo is answered on the reading
// goroutine; a handler a caller puts in its place, any other handler,
// and the echo of options built by hand are handed to a worker.
func TestQuickHandlers(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	node := wire.NewNodeID()
	echo := "sysecho." + node + ".echo.invoke"
	pin := "gpio." + node + ".pin.read"
	slow := func(ctx context.Context, _ json.RawMessage) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	for _, tc := range []struct {
		name  string
		opts  func() Options
		quick map[string]bool
	}{
		{"mock", func() Options { return MockOptions(node, set, 1) }, map[string]bool{echo: true, pin: false}},
		{"host", func() Options { return HostOptions(node, set, "dev") }, map[string]bool{echo: true}},
		{"echo replaced", func() Options {
			o := MockOptions(node, set, 1)
			o.Handlers["echo.invoke"] = slow
			return o
		}, map[string]bool{echo: false}},
		{"echo again, by the caller", func() Options {
			o := MockOptions(node, set, 1)
			o.Handlers["echo.invoke"] = func(ctx context.Context, args json.RawMessage) (any, error) {
				return Echo(node)(ctx, args)
			}
			return o
		}, map[string]bool{echo: false}},
		{"by hand", func() Options {
			return Options{NodeID: node, Schemas: set, Capabilities: []schemas.Capability{EchoCapability()},
				Handlers: map[string]Handler{"echo.invoke": Echo(node)}}
		}, map[string]bool{echo: false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.opts()
			o.URLs, o.Token = []string{"ws://127.0.0.1:1" + wire.Path}, "t"
			d, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for name := range tc.quick {
				names = append(names, name)
			}
			tools := d.toolTable(names)
			for name, want := range tc.quick {
				tl := tools[name]
				if tl == nil {
					t.Fatalf("%s: no tool", name)
				}
				if tl.quick != want {
					t.Errorf("%s: quick %v, want %v", name, tl.quick, want)
				}
			}
		})
	}
}
