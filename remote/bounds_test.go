package remote_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
)

// TestTierRefusesSchemaBombs: an upstream tool whose input or output
// schema is past okso's bounds never reaches okso_remotes; the tier says
// so once, at warn, naming the tool and the bound, and the upstream's
// other tools are listed.
func TestTierRefusesSchemaBombs(t *testing.T) {
	bomb := func(n int) json.RawMessage {
		defs := []string{`"d0":{"type":"object"}`}
		for i := 1; i <= n; i++ {
			defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i-1, i-1))
		}
		return json.RawMessage(fmt.Sprintf(`{"type":"object","$defs":{%s},"$ref":"#/$defs/d%d"}`, strings.Join(defs, ","), n))
	}
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	noop := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	u.Server().AddTool(&mcp.Tool{Name: "boom", InputSchema: bomb(18)}, noop)
	u.Server().AddTool(&mcp.Tool{Name: "boomout", InputSchema: json.RawMessage(`{"type":"object"}`), OutputSchema: bomb(12)}, noop)
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	log, refused := countingLog(t, "allowed tool not listed")
	runBuilt(t, newTier(t, b.nc, b.remotes, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"*"})}}, log))
	rec := b.next(t, "up")
	if rec == nil {
		t.Fatal("no record")
	}
	for _, tl := range rec.Tools {
		if strings.HasPrefix(tl.Name, "boom") {
			t.Errorf("%s reached the record", tl.Name)
		}
	}
	if len(rec.Tools) == 0 {
		t.Error("the upstream's other tools were not listed")
	}
	if n := refused.Load(); n != 2 {
		t.Errorf("%d warnings for two refused tools", n)
	}
}
