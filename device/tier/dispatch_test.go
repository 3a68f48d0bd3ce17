package tier_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// TestCallsInOrder: calls published in order to one node reach its device
// in that order (a device may rely on it: drive a pin up, then down).
func TestCallsInOrder(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc := tt.dial(t, nil)
	rc.authenticate(t, tt.token(t, node))
	rc.announce(t, node, echoCap("echo", bus.Constraints{})) // no rate or concurrency limit
	inbox := nats.NewInbox()
	sub, err := tt.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const n = 40
	for i := range n {
		b, _ := json.Marshal(bus.Call{Tool: echoTool(node), Arguments: json.RawMessage(`{"message":"x"}`)})
		m := nats.NewMsg(bus.NodeCmd(node))
		m.Reply, m.Data = inbox, b
		m.Header.Set(bus.HeaderTenant, tenant)
		m.Header.Set(bus.HeaderRequestID, strconv.Itoa(i))
		if err := tt.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for range n {
		var cmd wire.Cmd
		rc.recv(t, wire.TypeCmd, &cmd)
		got = append(got, cmd.RequestID)
	}
	for i, id := range got {
		if id != strconv.Itoa(i) {
			t.Fatalf("cmds reached the device in the order %v", got)
		}
	}
}

// TestOfflineWhenCloseBegins: the node leaves the registry as soon as the
// tier closes its session, not after the close handshake, which a silent
// device stalls for seconds.
func TestOfflineWhenCloseBegins(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	_, _ = tt.connectRaw(t, node) // never reads again: the handshake stalls
	events := tt.watch(t)
	start := time.Now()
	go func() { _ = tt.tier.Shutdown(context.Background()) }()
	waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == node && e.Node == nil })
	// The handshake gives a silent peer 2 s; the record goes in
	// milliseconds. Half that bound separates the two by far.
	if d := time.Since(start); d > time.Second {
		t.Errorf("record gone %v after the close began: it waited for the handshake", d)
	}
}

// TestCallDuringExpiredShutdown: when Shutdown gives up before a silent
// device's session has ended, a call to the node is answered at once (no
// responders), not left to its deadline.
func TestCallDuringExpiredShutdown(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	_, _ = tt.connectRaw(t, node) // never reads again: the session outlives Shutdown
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tt.tier.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown with a cancelled context reported every session ended")
	}
	r := tt.call(t.Context(), node, tenant, echoTool(node), `{"message":"x"}`)
	switch {
	case errors.Is(r.err, nats.ErrNoResponders):
	case r.err == nil && r.reply.Error != nil && r.reply.Error.Code == bus.CodeNodeOffline:
	default:
		t.Fatalf("call during an expired shutdown: %v; want no responders or E_NODE_OFFLINE", r)
	}
}
