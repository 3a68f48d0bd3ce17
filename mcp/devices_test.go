package mcp

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// TestLapsedNodeReturns: a node whose tier's lease lapsed is unlisted and
// remembered offline, for that reason; when the lease comes back, the
// same session is online again: listed, and no longer offline.
func TestLapsedNodeReturns(t *testing.T) {
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	sub, err := nc.Subscribe(bus.NodeCmd(node), func(m *nats.Msg) { _ = m.Respond(bus.OKReply([]byte(`{}`))) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	d := listingDevices(t)
	d.nc = nc
	shelf := d.feed.(*shelf)
	echo := schemas.Capability{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
	online := bus.Node{NodeID: node, Tenant: "demo", SessionID: "01hzx9k3m4p7q8r9s0t1v2w3xz",
		Capabilities: []schemas.Capability{echo}, State: bus.StateOnline}
	offline := online
	offline.State, offline.LastSeen = bus.StateOffline, time.Now()
	listed := func() bool {
		e, _ := shelf.lookup("demo", "sysecho."+node+".echo.invoke")
		return e != nil
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			next := shelf.next()
			if cond() {
				return
			}
			select {
			case <-next:
			case <-timeout:
				t.Fatalf("never %s", what)
			}
		}
	}

	d.apply(t.Context(), bus.Event{NodeID: node, Node: &online})
	waitFor("listed", listed)
	d.apply(t.Context(), bus.Event{NodeID: node, Node: &offline, Expired: true})
	if listed() || !d.isOffline(node) {
		t.Fatalf("after its tier's lease lapsed: listed %v, offline %v; want unlisted and offline", listed(), d.isOffline(node))
	}
	lapsed := CatalogView{shelf}.Unlisted()[sourceNameDevice+"/"+reasonLapsed]
	if lapsed != 1 {
		t.Errorf("unlisted %d times for a lapsed lease, want 1", lapsed)
	}
	d.apply(t.Context(), bus.Event{NodeID: node, Node: &online})
	waitFor("listed again", listed)
	if d.isOffline(node) {
		t.Error("listed again in the same session, yet still offline")
	}
	d.wait()
}
