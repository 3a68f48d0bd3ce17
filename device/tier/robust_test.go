package tier_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestLeaseReclaimed: a session whose registry record vanished (as when
// NATS lost it) claims it again once the tier sees it go, instead of
// closing its device with 4409.
func TestLeaseReclaimed(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	url := shortLeaseTier(t, tt)
	events := tt.watch(t)
	d := tt.runEchoAt(t, url)
	first := waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil })

	if err := tt.KV.Purge(t.Context(), d.node); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node == nil })
	again := waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil })
	if again.Node.SessionID != first.Node.SessionID {
		t.Errorf("record came back for session %s, want the same session %s", again.Node.SessionID, first.Node.SessionID)
	}
	// The device, written by hand, cannot reconnect: its echo through the
	// one connection it has shows the session lived on.
	tt.Echo(t, d.node)
}

// shortLeaseTier starts a second tier on tt's NATS whose registry lease is
// 2 s (refreshed every 2/3 s), and returns its device URL.
func shortLeaseTier(t *testing.T, tt *testTier) string {
	t.Helper()
	url, _ := leaseTier(t, tt, "", 2*time.Second)
	return url
}

// leaseTier starts a second tier on tt's NATS, named name (at random if
// empty), whose lease is ttl, and returns its device URL and its NATS
// connection.
func leaseTier(t *testing.T, tt *testTier, name string, ttl time.Duration) (string, *nats.Conn) {
	t.Helper()
	return bindingTier(t, tt, name, ttl, 0)
}

// bindingTier is leaseTier for a tier whose node bindings outlive their
// last session by bindingTTL (0: the default).
func bindingTier(t *testing.T, tt *testTier, name string, ttl, bindingTTL time.Duration) (string, *nats.Conn) {
	t.Helper()
	nc := tiertest.Connect(t, tt.Server, "short-lease-tier")
	reg, err := bus.OpenRegistry(t.Context(), nc, bus.RegistryOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	bindings, err := bus.OpenBindings(t.Context(), nc, bus.BindingsOptions{Registry: reg, TTL: bindingTTL})
	if err != nil {
		t.Fatal(err)
	}
	short, err := tier.New(tier.Options{NC: nc, Registry: reg, Bindings: bindings, Schemas: tt.Schemas, Name: name,
		Verifier: auth.NewVerifier(tt.Signer.Public(), auth.AudienceDevice),
		Auditor:  &bus.Auditor{Log: slog.New(slog.NewJSONHandler(tt.Audit, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(short.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), tiertest.WaitFor)
		defer cancel()
		if err := short.Shutdown(ctx); err != nil && !nc.IsClosed() { // a test may kill its NATS link
			t.Errorf("tier shutdown: %v", err)
		}
		hs.Close()
	})
	return "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path, nc
}

// TestOlderRecordReplaced: when the claims of two sessions of a node
// cross (the older session's record written after the newer one's), the
// newer session takes the record back once the tier sees it rather than
// leave with 4409 for an older session.
func TestOlderRecordReplaced(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	url := shortLeaseTier(t, tt)
	events := tt.watch(t)
	d := tt.runEchoAt(t, url)
	first := waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil })

	older := *first.Node
	older.SessionID = "00000000000000000000000000" // before any ULID
	if _, err := tt.Registry.Claim(t.Context(), older); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, func(e bus.Event) bool {
		return e.NodeID == d.node && e.Node != nil && e.Node.SessionID == older.SessionID
	})
	again := waitEvent(t, events, func(e bus.Event) bool {
		return e.NodeID == d.node && e.Node != nil && e.Node.SessionID != older.SessionID
	})
	if again.Node.SessionID != first.Node.SessionID || again.Node.Offline() {
		t.Errorf("record came back as %+v, want session %s online", again.Node, first.Node.SessionID)
	}
	tt.Echo(t, d.node)
}

// TestCloseHandshakeBounded: a client that sends part of an oversize frame
// and then stalls gets 4413, and cannot keep its session (or the tier's
// shutdown) waiting on the close handshake.
func TestCloseHandshakeBounded(t *testing.T) {
	tt := newTestTier(t, tier.Options{MaxFrameBytes: 1024})
	rc := tt.dial(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	w, err := rc.c.Writer(ctx, websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("x", 512))
	for range 40 { // 20 KiB, past the limit and the writer's buffer; never finished
		if _, err := w.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionProtocol && e.Code == "4413" })
	sctx, scancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer scancel()
	if err := tt.Tier.Shutdown(sctx); err != nil {
		t.Fatalf("a stalled peer held the tier: %v", err)
	}
}

// TestTakeoverAcrossTiers: a node that connects again through another tier
// replica is owned by the new session at once: the older one, on the other
// tier, gets 4409, its late cleanup leaves the new record alone, and each
// call gets exactly one reply, from the new session.
func TestTakeoverAcrossTiers(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	_, urlB := tt.StartReplica(t, tier.Options{})
	node := wire.NewNodeID()
	events := tt.watch(t)

	first, _ := tt.connectRaw(t, node)
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, urlB, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	second := &rawClient{c: c, set: tt.Schemas}
	ok := second.authenticate(t, tt.Token(t, node))
	second.announce(t, node, echoCapability())

	if code, _ := first.waitClose(t); code != wire.CloseReplaced {
		t.Fatalf("older session closed with %d, want 4409", code)
	}
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionDisconnect && e.NodeID == node })
	if r := tt.Record(t, node); r == nil || r.SessionID != ok.SessionID {
		t.Fatalf("registry record %+v, want the newer session %s", r, ok.SessionID)
	}
	for range 3 {
		res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
		second.answerEcho(t, node)
		tiertest.WantOK(t, <-res)
	}
	select {
	case e := <-events:
		if e.NodeID == node && (e.Node == nil || e.Node.Offline()) {
			t.Errorf("the older session's cleanup took the node offline: %+v", e.Node)
		}
	default:
	}
}

// TestConnectionGuards: connection attempts beyond a source address's
// budget, or beyond the tier's session limit, close with 4429; calls
// beyond the per-node pending limit get E_RATE_LIMITED. A bystander keeps
// working.
func TestConnectionGuards(t *testing.T) {
	t.Run("per address", func(t *testing.T) {
		// A budget that never refills within the test, however the
		// machine's clock is slewed (one token per 11 days).
		tt := newTestTier(t, tier.Options{ConnRatePerIP: 1e-6, ConnBurstPerIP: 2})
		tt.runEcho(t) // the first attempt
		// The tier takes an attempt from the budget after the upgrade:
		// the second has been counted once its hello comes, and not
		// before, whatever the order of the dials.
		tt.dial(t, nil).recv(t, wire.TypeHello, nil)
		third := tt.dial(t, nil)
		if code, frames := third.waitClose(t); code != wire.CloseTooMany || len(frames) != 1 ||
			frames[0].Code != schemas.CodeRateLimited {
			t.Fatalf("third attempt: %d %+v, want 4429 with E_RATE_LIMITED", code, frames)
		}
	})
	t.Run("sessions", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{MaxSessions: 1})
		d := tt.runEcho(t)
		extra := tt.dial(t, nil)
		if code, _ := extra.waitClose(t); code != wire.CloseTooMany {
			t.Fatalf("connection past the limit: %d, want 4429", code)
		}
		tt.Echo(t, d.node)
	})
	t.Run("handshakes", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{MaxHandshakes: 1})
		first := tt.dial(t, nil)
		first.recv(t, wire.TypeHello, nil) // the tier's one handshake, in progress
		second := tt.dial(t, nil)
		if code, frames := second.waitClose(t); code != wire.CloseTooMany || len(frames) != 1 ||
			frames[0].Code != schemas.CodeRateLimited {
			t.Fatalf("a handshake past the bound: %d %+v, want 4429 with E_RATE_LIMITED", code, frames)
		}
		// An abandoned handshake gives its place back, and so does one
		// that went through: two devices in turn connect and answer.
		first.c.CloseNow()
		d := tt.runEcho(t)
		tt.Echo(t, d.node)
		tt.Echo(t, tt.runEcho(t).node)
	})
	t.Run("pending per node", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{MaxPendingPerNode: 1})
		node := wire.NewNodeID()
		rc, _ := tt.connectRaw(t, node)
		first := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"1"}`)
		var cmd wire.Cmd
		e := rc.recv(t, wire.TypeCmd, &cmd) // in flight, unanswered
		tiertest.WantCode(t, tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"2"}`), schemas.CodeRateLimited)
		res, _ := json.Marshal(tiertest.EchoResult{Message: "1", NodeID: node, ReceivedAtMs: time.Now().UnixMilli()})
		rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: res})
		tiertest.WantOK(t, <-first)
	})
}
