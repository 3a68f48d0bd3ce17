package roles

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

// TestSafetyMatrix: each token sees exactly the tools its scopes may call,
// with annotations that follow the safety class, and a call beyond its
// scopes is E_SAFETY_DENIED.
func TestSafetyMatrix(t *testing.T) {
	f := startAllInOne(t, 1, nil)
	var node string
	for id := range f.nodeIDs() {
		node = id
	}
	read, write := "gpio."+node+".pin.read", "gpio."+node+".pin.write"
	cases := []struct {
		name   string
		scopes []string
		see    []string // of the pin's tools
		write  string   // outcome of a write
	}{
		{"read only", []string{auth.ScopeReadOnly}, []string{read}, schemas.CodeSafetyDenied},
		// A scope implies the classes below it (DESIGN.md §5).
		{"mutating only", []string{auth.ScopeMutating}, []string{read, write}, ""},
		{"read and mutate", []string{auth.ScopeReadOnly, auth.ScopeMutating}, []string{read, write}, ""},
		{"destructive only", []string{auth.ScopeDestructive}, []string{read, write}, ""},
		{"no call scope", []string{auth.ScopeDeviceConnect}, nil, schemas.CodeSafetyDenied},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := f.client(f.token(auth.MintOptions{Scopes: c.scopes}), "")
			list, err := s.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var pins []string
			for _, tl := range list.Tools {
				if strings.HasPrefix(tl.Name, "gpio-") {
					pins = append(pins, tl.Name)
					a := tl.Annotations
					switch tl.Name {
					case listedName(read):
						if !a.ReadOnlyHint || a.DestructiveHint != nil {
							t.Errorf("%s annotations %+v: want readOnly", tl.Name, a)
						}
					case listedName(write):
						if a.ReadOnlyHint || a.DestructiveHint == nil || *a.DestructiveHint {
							t.Errorf("%s annotations %+v: want not readOnly, not destructive", tl.Name, a)
						}
					}
				}
			}
			slices.Sort(pins)
			var see []string
			for _, name := range c.see {
				see = append(see, listedName(name))
			}
			if !slices.Equal(pins, see) {
				t.Errorf("sees %v, want %v", pins, c.see)
			}
			res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: write, Arguments: map[string]any{"level": 1}})
			if err != nil {
				t.Fatal(err)
			}
			if c.write == "" {
				if res.IsError {
					t.Fatalf("write failed: %+v", res.StructuredContent)
				}
				var out struct {
					Level, Previous int
					NodeID          string `json:"node_id"`
				}
				b, _ := json.Marshal(res.StructuredContent)
				if json.Unmarshal(b, &out); out.Level != 1 || out.NodeID != node {
					t.Errorf("write result %s", b)
				}
			} else if e := envelope(t, res); e.Code != c.write {
				t.Errorf("write: %s, want %s", e.Code, c.write)
			}
		})
	}
}

// nodeIDs returns the nodes the gateway lists.
func (f *fixture) nodeIDs() map[string]bool { return f.a.gw.gw.Devices().IDs() }
