package tier_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestCallsInOrder: calls published in order to one node reach its device
// in that order (a device may rely on it: drive a pin up, then down).
func TestCallsInOrder(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc := tt.dial(t, nil)
	rc.authenticate(t, tt.Token(t, node))
	rc.announce(t, node, tiertest.EchoCap("echo", schemas.Constraints{})) // no rate or concurrency limit
	inbox := nats.NewInbox()
	sub, err := tt.NC.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const n = 40
	for i := range n {
		b, _ := json.Marshal(bus.Call{Tool: tiertest.EchoTool(node), Arguments: json.RawMessage(`{"message":"x"}`)})
		m := nats.NewMsg(bus.NodeCmd(node))
		m.Reply, m.Data = inbox, b
		m.Header.Set(bus.HeaderTenant, tiertest.Tenant)
		m.Header.Set(bus.HeaderRequestID, strconv.Itoa(i))
		if err := tt.NC.PublishMsg(m); err != nil {
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
	go func() { _ = tt.Tier.Shutdown(context.Background()) }()
	waitEvent(t, events, func(e bus.Event) bool { return leftEvent(e, node) })
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
	_, _ = tt.connectRaw(t, node) // never reads again: its close handshake stalls
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tt.Tier.Shutdown(ctx); err == nil {
		t.Fatal("Shutdown with a cancelled context reported every session ended")
	}
	r := tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"x"}`)
	switch {
	case errors.Is(r.Err, nats.ErrNoResponders):
	case r.Err == nil && r.Reply.Error != nil && r.Reply.Error.Code == schemas.CodeNodeOffline:
	default:
		t.Fatalf("call during an expired shutdown: %v; want no responders or E_NODE_OFFLINE", r)
	}
}

// TestShutdownWaitsForItsGoroutines: Shutdown returns only once every
// goroutine running the tier's code has ended (sessions, their closes,
// the dispatcher and its workers, the tool watch), even when its context
// ends first: then a device that never reads, whose close handshake would
// last closeGrace, is dropped, and its session has ended (and audited so)
// by the time Shutdown returns.
func TestShutdownWaitsForItsGoroutines(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	if err := tt.Tier.Shutdown(t.Context()); err != nil { // only the tier below runs
		t.Fatal(err)
	}
	nc := tiertest.Connect(t, tt.Server, "okso-device-tier-b")
	reg, err := bus.OpenRegistry(t.Context(), nc, bus.RegistryOptions{TTL: tiertest.RegistryTTL})
	if err != nil {
		t.Fatal(err)
	}
	bindings, err := bus.OpenBindings(t.Context(), nc, bus.BindingsOptions{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tier.New(tier.Options{NC: nc, Registry: reg, Bindings: bindings, Schemas: tt.Schemas,
		Verifier: auth.NewVerifier(tt.Signer.Public(), auth.AudienceDevice),
		Auditor:  &bus.Auditor{Log: slog.New(slog.NewJSONHandler(tt.Audit, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(b.Handler())
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path

	silent := wire.NewNodeID()
	rc := tt.dialURL(t, url, nil)
	rc.authenticate(t, tt.Token(t, silent))
	rc.announce(t, silent, tiertest.EchoCap("echo", schemas.Constraints{DeadlineMsDefault: 100})) // and never reads again
	d := tt.runEchoAt(t, url)
	tt.Echo(t, d.node)
	// A call that expires on the silent device: the tier's cancel goes out
	// from a goroutine of its own.
	tiertest.WantCode(t, tt.Call(t.Context(), silent, tiertest.Tenant, tiertest.EchoTool(silent), `{"message":"hi"}`), schemas.CodeDeadlineExceeded)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with a cancelled context: %v, want context.Canceled", err)
	}
	disconnected := func(node string) func(tiertest.AuditEntry) bool {
		return func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionDisconnect && e.NodeID == node }
	}
	if gs := tierGoroutinesAfter(time.Second); len(gs) > 0 {
		t.Errorf("goroutines of the tier running after Shutdown returned:\n\n%s", strings.Join(gs, "\n\n"))
	}
	for _, node := range []string{silent, d.node} {
		if n := tt.Audit.Count(disconnected(node)); n != 1 {
			t.Errorf("node %s: %d disconnect events when Shutdown returned, want its session ended", node, n)
		}
	}
	if err := b.Shutdown(t.Context()); err != nil {
		t.Errorf("Shutdown again: %v", err)
	}
	hs.Close()
}

// tierGoroutines returns the stacks of the goroutines that run code of
// package tier or of its worker pool, its tests' left out.
// tierGoroutinesAfter returns the tier's goroutines still there after
// grace: one that said it is done may still be returning from its last
// deferred call when Shutdown returns, and is gone a moment later; one
// that Shutdown did not wait for is blocked, and stays.
func tierGoroutinesAfter(grace time.Duration) []string {
	deadline := time.Now().Add(grace)
	for {
		gs := tierGoroutines()
		if len(gs) == 0 || time.Now().After(deadline) {
			return gs
		}
		runtime.Gosched()
		<-time.After(10 * time.Millisecond)
	}
}

func tierGoroutines() []string {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "okso/device/tier.") || strings.Contains(g, "okso/device/internal/workers.") {
			found = append(found, g)
		}
	}
	return found
}
