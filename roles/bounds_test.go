package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// schemaBomb is allOf of two $refs to the level below, n levels deep:
// checking {} against it doubles in cost per level.
func schemaBomb(n int) string {
	defs := []string{`"d0":{"type":"object"}`}
	for i := 1; i <= n; i++ {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i-1, i-1))
	}
	return fmt.Sprintf(`{"type":"object","$defs":{%s},"$ref":"#/$defs/d%d"}`, strings.Join(defs, ","), n)
}

// TestSchemaBombs: a caller tool or an upstream tool whose schema is past
// okso's bounds is refused where it is declared (the declaration fails
// with E_MANIFEST_INVALID naming the tool and the bound; the upstream's
// tool is left out), and no check against it ever runs: the gateway's
// count of foreign checks does not move for calls of it, and moves for a
// tool that was admitted.
func TestSchemaBombs(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	gw := f.a.gw.gw
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	caller := f.relayClient(f.a.MCPURL(), f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating}), nil)
	noTool := func(name string) {
		t.Helper()
		_, err := caller.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{}})
		if err == nil || !strings.Contains(err.Error(), "-32602") && !strings.Contains(err.Error(), "unknown tool") {
			t.Errorf("a call of %s: %v, want no such tool", name, err)
		}
	}

	for _, n := range []int{8, 21, 30} {
		t.Run(fmt.Sprintf("caller tool, depth %d", n), func(t *testing.T) {
			decl := `{"caller_id":"bomb","tools":[{"name":"boom","inputSchema":` + schemaBomb(n) + `}]}`
			s := f.relayClient(f.a.MCPURL(), tokA, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // an accepted listen stays open
			defer cancel()
			res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(decl),
				Meta: sdk.Meta{"progressToken": "bomb"}})
			if err != nil {
				t.Fatal(err)
			}
			e := envelope(t, res)
			if e.Code != schemas.CodeManifestInvalid || !strings.Contains(e.Message, "(boom)") || !strings.Contains(e.Message, "expansion bound") {
				t.Errorf("declaring the bomb: %s, want E_MANIFEST_INVALID naming the tool and the bound", e.JSON())
			}
			before := gw.Catalog().ForeignChecks()
			noTool("bomb_boom")
			if got := gw.Catalog().ForeignChecks(); got != before {
				t.Errorf("%d checks ran for a refused tool", got-before)
			}
		})
	}

	t.Run("upstream tool", func(t *testing.T) {
		remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
		if err != nil {
			t.Fatal(err)
		}
		standUpstream(t, f.nc, "up", map[string]func(json.RawMessage) string{"echo": upstreamEcho})
		// Anything may write the bucket: the gateway checks again what
		// the remote tier would have refused.
		rec := &bus.Remote{Upstream: "up", Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000,
			Tools: []bus.RemoteTool{
				{Name: "echo", InputSchema: json.RawMessage(echoInput), OutputSchema: json.RawMessage(echoOutput), Safety: schemas.SafetyReadOnly},
				{Name: "boom", InputSchema: json.RawMessage(schemaBomb(24)), Safety: schemas.SafetyReadOnly},
				{Name: "boomout", InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: json.RawMessage(schemaBomb(18)), Safety: schemas.SafetyReadOnly},
			}}
		f.putRemote(remotes, rec, DefaultTenant, "up.echo", true)
		if gw.Catalog().Has(DefaultTenant, "up.boom") || gw.Catalog().Has(DefaultTenant, "up.boomout") {
			t.Fatal("an upstream tool past the bounds is listed")
		}
		before := gw.Catalog().ForeignChecks()
		noTool("up.boom")
		noTool("up.boomout")
		if got := gw.Catalog().ForeignChecks(); got != before {
			t.Errorf("%d checks ran for refused tools", got-before)
		}
		// The count moves for the tool that was admitted (arguments and
		// result).
		res, err := caller.CallTool(t.Context(), &sdk.CallToolParams{Name: "up.echo", Arguments: map[string]any{"message": "hi"}})
		if err != nil || res.IsError {
			t.Fatalf("up.echo: %v %+v", err, res)
		}
		if got := gw.Catalog().ForeignChecks(); got != before+2 {
			t.Errorf("a call of an admitted tool ran %d checks, want 2", got-before)
		}
	})
}
