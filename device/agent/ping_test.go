package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestDevicePingsOnlySilentTier: a device pings its tier only when it
// heard nothing from it for a whole interval. While the tier pings it
// more often than that, the device sends no ping of its own; once the
// tier falls silent (still answering), the device pings it.
func TestDevicePingsOnlySilentTier(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	const interval = 500 * time.Millisecond
	devicePinged := make(chan struct{}, 1)
	rt := newRawTierWith(t, set, &websocket.AcceptOptions{Subprotocols: []string{wire.Subprotocol},
		OnPingReceived: func(context.Context, []byte) bool {
			select {
			case devicePinged <- struct{}{}:
			default:
			}
			return true
		}})
	ctx, tc := connectIdle(t, set, rt, interval)

	// Four intervals of the tier pinging every tenth of one.
	tick := time.NewTicker(interval / 10)
	defer tick.Stop()
	for range 40 {
		<-tick.C
		pctx, pcancel := context.WithTimeout(ctx, waitFor)
		err := tc.c.Ping(pctx)
		pcancel()
		if err != nil {
			t.Fatalf("the device did not answer the tier's ping: %v", err)
		}
	}
	select {
	case <-devicePinged:
		t.Fatal("the device pinged a tier that pinged it ten times an interval")
	default:
	}
	// The tier falls silent: the device pings it.
	select {
	case <-devicePinged:
	case <-time.After(waitFor):
		t.Fatal("the device did not ping a silent tier")
	}
}

// TestDeviceHeartbeats: a device that has sent nothing for an interval
// sends a heartbeat, an unsolicited pong with no payload that its tier
// need not answer; it pings a tier that stays silent only after several
// heartbeats, and goes on after the tier answers. A heartbeat that broke
// the library's frames, or was not one, fails the tier's reads.
func TestDeviceHeartbeats(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	const interval = 100 * time.Millisecond
	// What the tier hears from an idle device, in order: "beat", "ping".
	heard := make(chan string, 64)
	rt := newRawTierWith(t, set, &websocket.AcceptOptions{Subprotocols: []string{wire.Subprotocol},
		OnPingReceived: func(context.Context, []byte) bool { heard <- "ping"; return true },
		OnPongReceived: func(_ context.Context, p []byte) {
			if len(p) == 0 {
				heard <- "beat"
			} else {
				heard <- "pong " + string(p)
			}
		}})
	connectIdle(t, set, rt, interval)

	next := func() string {
		t.Helper()
		select {
		case h := <-heard:
			return h
		case <-time.After(waitFor):
			t.Fatal("the tier heard nothing from an idle device")
			return ""
		}
	}
	for round := range 2 {
		beats := 0
		for h := next(); h != "ping"; h = next() {
			if h != "beat" {
				t.Fatalf("round %d: the tier heard %q, want a heartbeat or a ping", round, h)
			}
			beats++
		}
		if beats < 2 {
			t.Fatalf("round %d: the device pinged its tier after %d heartbeats, want a ping only after several", round, beats)
		}
	}
}

// connectIdle runs a mock device with ping interval interval against rt,
// and has the tier's end read on (so that pings, pongs and heartbeats are
// handled) until the test ends, which it returns with the connection.
func connectIdle(t *testing.T, set *schemas.Set, rt *rawTier, interval time.Duration) (context.Context, *tierConn) {
	t.Helper()
	node := wire.NewNodeID()
	o := agent.MockOptions(node, set, 1)
	o.URLs, o.Token, o.PingInterval = []string{rt.url}, "unchecked", interval
	runStandalone(t, o)
	tc := rt.accept(t)
	tc.handshake(t, node, time.Now().UnixMilli())
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	tc.c.CloseRead(ctx)
	return ctx, tc
}
