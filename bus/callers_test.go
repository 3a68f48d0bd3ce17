package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
)

func openCallers(t *testing.T, nc *nats.Conn, opts bus.CallersOptions) *bus.Callers {
	t.Helper()
	c, err := bus.OpenCallers(ctx(t), nc, opts)
	if err != nil {
		t.Fatalf("OpenCallers: %v", err)
	}
	return c
}

func claimCaller(t *testing.T, c *bus.Callers, cl bus.CallerClaim) *bus.CallerLease {
	t.Helper()
	l, err := c.Claim(ctx(t), cl)
	if err != nil {
		t.Fatalf("Claim(%+v): %v", cl, err)
	}
	return l
}

// holderOf returns the listen holding a caller id of tenant demo, "" when
// none does.
func holderOf(t *testing.T, c *bus.Callers, callerID string) string {
	t.Helper()
	cl, err := c.ClaimOf(ctx(t), "demo", callerID)
	if err != nil {
		t.Fatal(err)
	}
	if cl == nil {
		return ""
	}
	return cl.ListenID
}

// One agent holds a caller id: another is refused, from any replica, and
// writes nothing; the same agent's new listen takes the claim over, after
// which the old lease can neither refresh nor release it; a released id
// is free for anyone.
func TestCallerClaim(t *testing.T) {
	srv, nc := startBus(t)
	c := openCallers(t, nc, bus.CallersOptions{})
	c2 := openCallers(t, connect(t, srv, "replica-2"), bus.CallersOptions{})
	a1 := bus.CallerClaim{ListenID: "l1", Tenant: "demo", Subject: "agent-a", CallerID: "a"}
	first := claimCaller(t, c, a1)
	if first.Replaced() != "" {
		t.Errorf("a free id's claim replaced %q", first.Replaced())
	}
	for _, cc := range []*bus.Callers{c, c2} {
		if _, err := cc.Claim(ctx(t), bus.CallerClaim{ListenID: "x1", Tenant: "demo", Subject: "agent-x", CallerID: "a"}); !errors.Is(err, bus.ErrCallerHeld) {
			t.Fatalf("another agent's claim: %v, want ErrCallerHeld", err)
		}
	}
	if h := holderOf(t, c, "a"); h != "l1" {
		t.Fatalf("after refusals the claim names %q, want l1", h)
	}
	// The same caller id in another tenant is another claim.
	claimCaller(t, c2, bus.CallerClaim{ListenID: "o1", Tenant: "other", Subject: "agent-x", CallerID: "a"})

	a2 := a1
	a2.ListenID = "l2"
	next := claimCaller(t, c2, a2)
	if next.Replaced() != "l1" {
		t.Errorf("the takeover replaced %q, want l1", next.Replaced())
	}
	if err := first.Refresh(ctx(t)); !errors.Is(err, bus.ErrClaimLost) {
		t.Errorf("the old lease's refresh: %v, want ErrClaimLost", err)
	}
	if err := first.Release(ctx(t)); err != nil {
		t.Errorf("the old lease's release: %v", err)
	}
	if h := holderOf(t, c, "a"); h != "l2" {
		t.Fatalf("after the old lease's release the claim names %q, want l2", h)
	}
	if err := next.Refresh(ctx(t)); err != nil {
		t.Errorf("the new lease's refresh: %v", err)
	}
	if err := next.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if h := holderOf(t, c, "a"); h != "" {
		t.Fatalf("after its release the claim names %q", h)
	}
	x := claimCaller(t, c, bus.CallerClaim{ListenID: "x2", Tenant: "demo", Subject: "agent-x", CallerID: "a"})
	if x.Replaced() != "" {
		t.Errorf("a released id's claim replaced %q", x.Replaced())
	}
	if _, err := c.Claim(ctx(t), bus.CallerClaim{ListenID: "l3", Tenant: "demo", Subject: "agent-a", CallerID: "a.b"}); err == nil {
		t.Error("a caller id that is no key token was claimed")
	}
}

// Agents claiming one free caller id at once, on replicas of their own:
// one holds it, every other is refused, round after round.
func TestCallerClaimRace(t *testing.T) {
	srv, nc := startBus(t)
	openCallers(t, nc, bus.CallersOptions{})
	const agents, rounds = 4, 50
	cs := make([]*bus.Callers, agents)
	for i := range cs {
		cs[i] = openCallers(t, connect(t, srv, fmt.Sprintf("replica-%d", i)), bus.CallersOptions{})
	}
	for r := range rounds {
		callerID := fmt.Sprintf("c%d", r)
		var (
			wg            sync.WaitGroup
			mu            sync.Mutex
			held, refused int
		)
		start := make(chan struct{})
		for i, c := range cs {
			wg.Go(func() {
				<-start
				_, err := c.Claim(ctx(t), bus.CallerClaim{ListenID: fmt.Sprintf("l%d", i), Tenant: "demo",
					Subject: fmt.Sprintf("agent-%d", i), CallerID: callerID})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					held++
				case errors.Is(err, bus.ErrCallerHeld):
					refused++
				default:
					t.Errorf("round %d: agent %d: %v", r, i, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if held != 1 || refused != agents-1 {
			t.Fatalf("round %d: %d agents hold %s, %d refused; want 1 and %d", r, held, callerID, refused, agents-1)
		}
	}
}

// A claim whose lease is not refreshed lapses: then another agent may
// take the id, and the old lease is lost.
func TestCallerClaimLapses(t *testing.T) {
	_, nc := startBus(t)
	c := openCallers(t, nc, bus.CallersOptions{TTL: time.Second})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketCallers)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx(t), bus.ClaimKey("demo", "a"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	old := claimCaller(t, c, bus.CallerClaim{ListenID: "l1", Tenant: "demo", Subject: "agent-a", CallerID: "a"})
	for gone := false; !gone; {
		select {
		case e := <-w.Updates():
			gone = e != nil && e.Operation() != jetstream.KeyValuePut
		case <-time.After(eventTimeout):
			t.Fatal("the claim never lapsed")
		}
	}
	x := claimCaller(t, c, bus.CallerClaim{ListenID: "x1", Tenant: "demo", Subject: "agent-x", CallerID: "a"})
	if x.Replaced() != "" {
		t.Errorf("a lapsed claim's successor replaced %q", x.Replaced())
	}
	if err := old.Refresh(ctx(t)); !errors.Is(err, bus.ErrClaimLost) {
		t.Errorf("the lapsed lease's refresh: %v, want ErrClaimLost", err)
	}
	if err := old.Release(ctx(t)); err != nil || holderOf(t, c, "a") != "x1" {
		t.Errorf("the lapsed lease's release: %v; the claim names %q, want x1", err, holderOf(t, c, "a"))
	}
}

// The followers of okso_callers see declarations, never claims.
func TestCallersWatchPassesOverClaims(t *testing.T) {
	_, nc := startBus(t)
	c := openCallers(t, nc, bus.CallersOptions{})
	before := claimCaller(t, c, bus.CallerClaim{ListenID: "01kbx5q3m8v1f7r2p4w6y9z0ab", Tenant: "demo", Subject: "agent-a", CallerID: "a"})
	events := make(chan bus.CallerEvent, 16)
	ready := make(chan struct{})
	wctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Watch(wctx, func(ev bus.CallerEvent) { events <- ev }, func() { close(ready) }) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v", err)
		}
	}()
	select {
	case <-ready:
	case <-time.After(eventTimeout):
		t.Fatal("watch never ready")
	}
	// A claim made, refreshed, taken over and released, then a
	// declaration: the declaration is the first event.
	if err := before.Refresh(ctx(t)); err != nil {
		t.Fatal(err)
	}
	after := claimCaller(t, c, bus.CallerClaim{ListenID: "01kbx5q3m8v1f7r2p4w6y9z0ac", Tenant: "demo", Subject: "agent-a", CallerID: "a"})
	if err := after.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	rec := &bus.Caller{ListenID: "01kbx5q3m8v1f7r2p4w6y9z0ac", Tenant: "demo", Subject: "agent-a", CallerID: "a", Since: time.Now().UTC()}
	if err := c.Put(ctx(t), rec); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev.ListenID != rec.ListenID || ev.Caller == nil || ev.Initial {
			t.Fatalf("first event %+v, want the declaration of %s", ev, rec.ListenID)
		}
	case <-time.After(eventTimeout):
		t.Fatal("the declaration never came")
	}
}
