package tier_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
)

// bindingOf returns node's binding as stored: its TTL (the message's
// Nats-TTL header, "" for none) and its revision.
func bindingOf(t *testing.T, nc *nats.Conn, node string) (ttl string, rev uint64) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), "KV_"+bus.BucketNodeTenants)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), "$KV."+bus.BucketNodeTenants+"."+node)
	if err != nil {
		t.Fatalf("binding of %s: %v", node, err)
	}
	return m.Header.Get(jetstream.MsgTTLHeader), m.Sequence
}

// subscribe subscribes the test's connection to subject, flushed.
func subscribe(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// waitOffline waits until node's record is offline.
func (tt *testTier) waitOffline(t *testing.T, events <-chan bus.Event, node string) {
	t.Helper()
	for r := tt.Record(t, node); r == nil || !r.Offline(); r = tt.Record(t, node) {
		waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == node })
	}
}

// TestBindingHeldWithoutTTL: while its session lasts, a node's binding
// has no TTL and nothing writes it again, however many of the periods go
// by at which it used to be refreshed (a quarter of its TTL); when the
// device leaves, the binding gets its TTL.
func TestBindingHeldWithoutTTL(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	const bindingTTL = 4 * time.Second // refreshed every second, once
	url, _ := bindingTier(t, tt, "tier-binding", time.Second, bindingTTL)
	events := tt.watch(t)
	d := tt.runEchoAt(t, url)
	waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil && !e.Node.Offline() })
	ttl, rev := bindingOf(t, tt.NC, d.node)
	if ttl != "" {
		t.Fatalf("a live node's binding has TTL %q, want none", ttl)
	}
	writes := subscribe(t, tt.NC, "okso.v1.state."+bus.BucketNodeTenants+"."+d.node)
	beats := subscribe(t, tt.NC, "okso.v1.state."+bus.BucketTiers+".tier-binding")
	for range 9 { // three seconds: three of the old refresh periods
		if _, err := beats.NextMsg(tiertest.WaitFor); err != nil {
			t.Fatalf("the tier's heartbeat: %v", err)
		}
	}
	if err := tt.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := writes.Pending(); n != 0 {
		t.Fatalf("%d writes of a live node's binding, want none", n)
	}
	if ttl, now := bindingOf(t, tt.NC, d.node); ttl != "" || now != rev {
		t.Fatalf("the live node's binding: TTL %q, revision %d; want none, %d", ttl, now, rev)
	}

	d.leave(t)
	tt.waitOffline(t, events, d.node) // the binding is released before the record
	if ttl, _ := bindingOf(t, tt.NC, d.node); ttl != bindingTTL.String() {
		t.Fatalf("the binding of a node that left: TTL %q, want %v", ttl, bindingTTL)
	}
}

// TestBindingReplacedSession: a session replaced (4409) by a newer one
// on another tier leaves the newer session's binding as it is, with no
// TTL; the newer one's leave gives it the TTL.
func TestBindingReplacedSession(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	_, urlB := tt.StartReplica(t, tier.Options{})
	events := tt.watch(t)
	old := tt.runEcho(t)
	waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == old.node && e.Node != nil && !e.Node.Offline() })
	_, oldRev := bindingOf(t, tt.NC, old.node)

	rc := tt.dialURL(t, urlB, nil)
	rc.authenticate(t, tt.Token(t, old.node))
	rc.announce(t, old.node, echoCapability())
	ttl, rev := bindingOf(t, tt.NC, old.node)
	if ttl != "" || rev <= oldRev {
		t.Fatalf("the newer session's binding: TTL %q, revision %d; want none, after %d", ttl, rev, oldRev)
	}
	<-old.done // closed by the tier (4409)
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionDisconnect && e.NodeID == old.node
	}) // the replaced session's end is over
	if ttl, now := bindingOf(t, tt.NC, old.node); ttl != "" || now != rev {
		t.Fatalf("after the replaced session's end: TTL %q, revision %d; want none, %d", ttl, now, rev)
	}

	if err := rc.c.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatal(err)
	}
	tt.waitOffline(t, events, old.node)
	if ttl, _ := bindingOf(t, tt.NC, old.node); ttl != (24 * time.Hour).String() {
		t.Fatalf("after the newer session's leave: TTL %q, want 24h", ttl)
	}
}

// TestBindingTierKilled: the tier that sweeps a killed tier's nodes gives
// their bindings the TTL; a node whose device reconnected to another
// tier meanwhile keeps its binding without one.
func TestBindingTierKilled(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	url, nc := leaseTier(t, tt, "tier-doomed", time.Second)
	events := tt.watch(t)
	left, back := tt.runEchoAt(t, url), tt.runEchoAt(t, url)
	for _, d := range []*echoDevice{left, back} {
		waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil && !e.Node.Offline() })
	}
	nc.Close() // the tier can no longer write anything, as if killed

	// One device reconnects to the live tier.
	tt.connectRaw(t, back.node)
	_, rev := bindingOf(t, tt.NC, back.node)
	tt.waitOffline(t, events, left.node) // swept
	if ttl, _ := bindingOf(t, tt.NC, left.node); ttl != (24 * time.Hour).String() {
		t.Errorf("the swept node's binding: TTL %q, want 24h", ttl)
	}
	if r := tt.Record(t, back.node); r == nil || r.Offline() || r.Tier == "tier-doomed" {
		t.Fatalf("the record of the node back on the live tier: %+v", r)
	}
	if ttl, now := bindingOf(t, tt.NC, back.node); ttl != "" || now != rev {
		t.Errorf("the binding of the node back on the live tier: TTL %q, revision %d; want none, %d", ttl, now, rev)
	}
}

// TestConnectJetStreamOps counts the JetStream requests of a device's
// connect (reads are direct gets, writes publishes to a bucket's
// subjects): under a connect storm each one matters. A new node costs
// four (its binding read, the registry read for a live record of a tier
// older than bindings, its binding created, its record created where
// there is none); a node that comes back four (its binding read and
// written again, its record read and written).
func TestConnectJetStreamOps(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	events := tt.watch(t)
	ops := subscribe(t, tt.NC, "$JS.API.>")
	writes := subscribe(t, tt.NC, "$KV.>")
	// requests returns the JetStream requests about node since it was
	// last called (not the watches' and followers' reads of whole
	// buckets).
	requests := func(node string) []string {
		t.Helper()
		if err := tt.NC.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, sub := range []*nats.Subscription{ops, writes} {
			for m, err := sub.NextMsg(0); err == nil; m, err = sub.NextMsg(0) {
				if r := m.Subject + " " + string(m.Data); strings.Contains(r, node) {
					got = append(got, r)
				}
			}
		}
		return got
	}
	d := tt.runEcho(t)
	waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil && !e.Node.Offline() })
	if got := requests(d.node); len(got) != 4 {
		t.Errorf("a new node's connect made %d JetStream requests, want 4:\n%s", len(got), strings.Join(got, "\n"))
	}
	d.leave(t)
	tt.waitOffline(t, events, d.node)
	requests(d.node)
	tt.connectRaw(t, d.node)
	waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil && !e.Node.Offline() })
	if got := requests(d.node); len(got) != 4 {
		t.Errorf("a node's connect again made %d JetStream requests, want 4:\n%s", len(got), strings.Join(got, "\n"))
	}
}
