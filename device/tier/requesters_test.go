package tier_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/schemas"
)

// TestRequestsOnlyFromGateways: with Requesters, a node serves the calls
// a gateway sends, and drops (and audits) a message that reached its
// subject any other way: a client of another role, or JetStream made to
// publish a direct get's answer there, headers and all, by a client that
// may not publish to the subject itself.
func TestRequestsOnlyFromGateways(t *testing.T) {
	tt := newTestTier(t, tier.Options{Requesters: []bus.Role{bus.RoleGateway}})
	tt.Audit.KeepRaw()
	d := tt.runEcho(t)
	gw, err := tt.Server.ConnectAs(bus.RoleGateway, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	call := func(nc *nats.Conn) error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := nc.RequestMsgWithContext(ctx, tiertest.CallMsg(d.node, tiertest.Tenant, tiertest.EchoTool(d.node), `{"message":"hi"}`))
		return err
	}
	if err := call(gw); err != nil {
		t.Fatalf("a gateway's call: %v", err)
	}
	denied := func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionDenied && e.NodeID == d.node && e.Code == schemas.CodeSafetyDenied
	}

	// A client of no gateway's: its request is dropped unanswered.
	if err := call(tt.NC); err == nil {
		t.Fatal("a request with another reply subject than a gateway's was served")
	}
	tt.Audit.Wait(t, denied)

	// JetStream, asked for a stored message with the node's subject as
	// the reply subject, publishes it there: dropped too.
	forged, _ := json.Marshal(bus.Call{Tool: tiertest.EchoTool(d.node), Arguments: json.RawMessage(`{"message":"forged"}`)})
	m := nats.NewMsg("$KV." + bus.BucketNodes + ".forged")
	m.Data = forged
	m.Header.Set(bus.HeaderTenant, tiertest.Tenant)
	js, err := jetstream.New(tt.NC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	get := nats.NewMsg("$JS.API.DIRECT.GET.KV_" + bus.BucketNodes + ".$KV." + bus.BucketNodes + ".forged")
	get.Reply = bus.NodeCmd(d.node)
	if err := tt.NC.PublishMsg(get); err != nil {
		t.Fatal(err)
	}
	n := 0
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		if denied(e) {
			n++
		}
		return n == 2
	})
	if err := call(gw); err != nil {
		t.Fatalf("a gateway's call after: %v", err)
	}
	if n := tt.Audit.Count(func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionAllowed && e.NodeID == d.node
	}); n != 2 {
		t.Errorf("%d calls reached the device, want the gateway's two", n)
	}
}

// TestReflectedTakeoverDropped: a takeover notice that JetStream sent (a
// stored message with a takeover header, and an empty stream header of
// its own, answered by a direct get onto the node's cancel subject) ends
// no session.
func TestReflectedTakeoverDropped(t *testing.T) {
	tt := newTestTier(t, tier.Options{Requesters: []bus.Role{bus.RoleGateway}})
	d := tt.runEcho(t)
	js, err := jetstream.New(tt.NC)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("$KV." + bus.BucketNodes + ".takeover")
	m.Header[jetstream.StreamHeader] = []string{""}
	m.Header.Set(bus.HeaderTakeover, "zzzzzzzzzzzzzzzzzzzzzzzzzz") // newer than any session id
	if _, err := js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}
	get := nats.NewMsg("$JS.API.DIRECT.GET.KV_" + bus.BucketNodes + ".$KV." + bus.BucketNodes + ".takeover")
	get.Reply = bus.NodeCancel(d.node)
	if err := tt.NC.PublishMsg(get); err != nil {
		t.Fatal(err)
	}
	// A real takeover notice sent after it is handled after it; a cancel
	// of a stream the session does not have does nothing, and is a
	// handled message all the same.
	if err := tt.NC.Publish(bus.NodeCancel(d.node), []byte("no-such-stream")); err != nil {
		t.Fatal(err)
	}
	if err := tt.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	gw, err := tt.Server.ConnectAs(bus.RoleGateway, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	if _, err := gw.RequestMsgWithContext(ctx, tiertest.CallMsg(d.node, tiertest.Tenant, tiertest.EchoTool(d.node), `{"message":"hi"}`)); err != nil {
		t.Fatalf("the node after a reflected takeover: %v", err)
	}
	select {
	case <-d.done:
		t.Fatal("the session ended")
	default:
	}
}
