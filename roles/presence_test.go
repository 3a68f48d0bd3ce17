package roles

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// callCode calls the tool name and returns the code of its failure: the
// envelope of an isError result, or of a JSON-RPC error ("" when it
// succeeds).
func callCode(t *testing.T, s *sdk.ClientSession, name string) string {
	t.Helper()
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{"message": "hi"}})
	var rpcErr *jsonrpc.Error
	switch {
	case errors.As(err, &rpcErr):
		var e schemas.Error
		if json.Unmarshal(rpcErr.Data, &e) != nil {
			t.Fatalf("JSON-RPC error %v carries no envelope", rpcErr)
		}
		return e.Code
	case err != nil:
		t.Fatalf("call %s: %v", name, err)
	case res.IsError:
		return envelope(t, res).Code
	}
	return ""
}

// clientAt connects an MCP client with token to the gateway at url.
func (f *fixture) clientAt(url, token string) *sdk.ClientSession {
	f.t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
	tr := &sdk.StreamableClientTransport{Endpoint: url, HTTPClient: &httpClientWithToken(token).Client, MaxRetries: -1}
	s, err := c.Connect(f.t.Context(), tr, nil)
	if err != nil {
		f.t.Fatalf("connect MCP client to %s: %v", url, err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s
}

// waitGateway waits until cond holds of gw.
func waitGateway(t *testing.T, gw *mcp.Gateway, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := gw.Wait(ctx, func(map[string]int) bool { return cond() }); err != nil {
		t.Fatalf("gateway never saw %s: %v", what, err)
	}
}

// TestPresenceRemembers: a node that left is remembered as offline by
// every gateway replica, one that watched it leave and one started after:
// its tools leave tools/list, and a call of one answers E_NODE_OFFLINE to
// its tenant; to another tenant, and for a node id never seen, a call
// answers E_TOOL_NOT_FOUND.
func TestPresenceRemembers(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	replica := f.secondGateway(gatewayConfig{})
	id, stop := f.connectDevice(DefaultTenant, nil)
	waitGateway(t, replica.gw, "the node online", func() bool { return replica.gw.Devices().Listed(id) })
	if reg := f.record(id); reg == nil || reg.Offline() {
		t.Fatalf("registry record %+v, want online", reg)
	}

	stop()
	for _, gw := range []*mcp.Gateway{f.a.gw.gw, replica.gw} {
		waitGateway(t, gw, "the node offline", func() bool { return gw.Devices().Offline(id) && !gw.Devices().Listed(id) })
	}
	reg := f.record(id)
	if reg == nil || !reg.Offline() || reg.LastSeen.IsZero() {
		t.Fatalf("registry record %+v, want offline with last_seen", reg)
	}
	// A gateway started now (a restarted one) knows it from the registry
	// alone, once it is ready.
	restarted := f.secondGateway(gatewayConfig{})
	if !restarted.gw.Devices().Offline(id) {
		t.Fatal("restarted gateway does not know the node that left")
	}

	tok := f.token(auth.MintOptions{})
	other := f.token(auth.MintOptions{Tenant: "other"})
	for _, url := range []string{f.a.MCPURL(), replica.url(), restarted.url()} {
		s := f.clientAt(url, tok)
		list, err := s.ListTools(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range list.Tools {
			if nodeOf(tl) == id {
				t.Errorf("%s lists %s of the node that left", url, tl.Name)
			}
		}
		for _, name := range []string{echoName(id), listedName(echoName(id))} {
			if code := callCode(t, s, name); code != schemas.CodeNodeOffline {
				t.Errorf("%s: call %s of the node that left: %q, want E_NODE_OFFLINE", url, name, code)
			}
		}
		for name, why := range map[string]string{
			echoName(wire.NewNodeID()):                   "a node never seen",
			"sysecho." + id + ".echo.nope":               "a verb the node never had",
			listedName("sysecho." + id + ".nope.invoke"): "a capability the node never had",
		} {
			if code := callCode(t, s, name); code != schemas.CodeToolNotFound {
				t.Errorf("%s: call of %s: %q, want E_TOOL_NOT_FOUND", url, why, code)
			}
		}
		if code := callCode(t, f.clientAt(url, other), echoName(id)); code != schemas.CodeToolNotFound {
			t.Errorf("%s: another tenant's call of the node that left: %q, want E_TOOL_NOT_FOUND", url, code)
		}
	}
}

// record is the registry's record of a node (nil: none).
func (f *fixture) record(id string) *bus.Node {
	f.t.Helper()
	reg, err := bus.OpenRegistry(f.t.Context(), f.nc, bus.RegistryOptions{BindOnly: true})
	if err != nil {
		f.t.Fatal(err)
	}
	n, err := reg.Get(f.t.Context(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// TestPresenceReplacedSession: a node's new session replaces its old one
// (4409); the old session's end never marks the node offline, neither
// before the new session's record is written nor after.
func TestPresenceReplacedSession(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	audit := make(chan *nats.Msg, 256)
	if _, err := f.nc.ChanSubscribe(bus.Audit(DefaultTenant), audit); err != nil {
		t.Fatal(err)
	}
	id, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
		o.MaxBackoff = time.Hour // replaced, it stays away
	})
	old := f.record(id)

	reg, err := bus.OpenRegistry(t.Context(), f.nc, bus.RegistryOptions{BindOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan bus.Event, 64)
	wctx, stop := context.WithCancel(t.Context())
	watched := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		defer close(watched)
		_ = reg.Watch(wctx, func(e bus.Event) {
			if e.NodeID == id && !e.Initial {
				events <- e
			}
		}, func() { close(ready) })
	}()
	defer func() { stop(); <-watched }()
	<-ready

	tok, err := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	if err != nil {
		t.Fatal(err)
	}
	o := agent.MockOptions(id, f.a.c.schemas, 1)
	o.URLs, o.Token, o.TLS = []string{f.a.DeviceURL()}, tok, f.a.tier.ownTLS()
	d, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Every registry write of the node until the old session's end is
	// audited (its record is written, or not, before that) and the new
	// session's record is in.
	var oldGone, newOnline bool
	deadline := time.After(10 * time.Second)
	for !oldGone || !newOnline {
		select {
		case e := <-events:
			switch {
			case e.Node == nil || e.Node.Offline():
				t.Fatalf("the node went offline while a new session replaced the old: %+v", e.Node)
			case e.Node.SessionID != old.SessionID:
				newOnline = true
			}
		case <-deadline:
			t.Fatalf("old session ended: %v; new session online: %v", oldGone, newOnline)
		case m := <-audit:
			var a bus.AuditEvent
			if json.Unmarshal(m.Data, &a) == nil && a.NodeID == id && a.Actor == "tier" &&
				a.Decision == bus.DecisionDisconnect {
				oldGone = true
			}
		}
	}
	rec := f.record(id)
	if rec == nil || rec.Offline() || rec.SessionID == old.SessionID {
		t.Fatalf("registry record %+v, want the new session online", rec)
	}
	gw := f.a.gw.gw
	waitGateway(t, gw, "the new session listed", func() bool { return gw.Devices().Listed(id) })
	if gw.Devices().Offline(id) {
		t.Error("gateway holds the replaced node offline")
	}
	s := f.client(f.token(auth.MintOptions{}), "")
	if code := callCode(t, s, echoName(id)); code != "" {
		t.Errorf("call of the node's new session: %s, want success", code)
	}
}

// TestPresenceRetention: a node that left is remembered --offline-retention,
// then forgotten like a node never seen, by every gateway.
func TestPresenceRetention(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Tier.OfflineRetention = time.Second })
	id, stop := f.connectDevice(DefaultTenant, nil)
	stop()
	gw := f.a.gw.gw
	waitGateway(t, gw, "the node offline", func() bool { return gw.Devices().Offline(id) })
	s := f.client(f.token(auth.MintOptions{}), "")
	if code := callCode(t, s, echoName(id)); code != schemas.CodeNodeOffline {
		t.Errorf("call of the node that left: %q, want E_NODE_OFFLINE", code)
	}
	waitGateway(t, gw, "the offline node forgotten", func() bool { return !gw.Devices().Offline(id) })
	if reg := f.record(id); reg != nil {
		t.Errorf("registry record %+v after the offline retention, want none", reg)
	}
	if code := callCode(t, s, echoName(id)); code != schemas.CodeToolNotFound {
		t.Errorf("call of the node forgotten: %q, want E_TOOL_NOT_FOUND", code)
	}
}
