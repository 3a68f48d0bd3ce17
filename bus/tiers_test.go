package bus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
)

func holdTier(t *testing.T, r *bus.Registry, id string) *bus.TierLease {
	t.Helper()
	l, err := r.HoldTier(ctx(t), id)
	if err != nil {
		t.Fatalf("HoldTier %s: %v", id, err)
	}
	return l
}

func tierClaim(t *testing.T, l *bus.TierLease, n bus.Node) *bus.Lease {
	t.Helper()
	ls, err := l.Claim(ctx(t), n)
	if err != nil {
		t.Fatalf("Claim %s under %s: %v", n.NodeID, l.ID(), err)
	}
	return ls
}

// stateCount counts the messages republished for bucket: every write
// of a key, and every marker.
type stateCount struct{ sub *nats.Subscription }

func countState(t *testing.T, nc *nats.Conn, bucket string) *stateCount {
	t.Helper()
	sub, err := nc.SubscribeSync("okso.v1.state." + bucket + ".>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &stateCount{sub}
}

// pending is how many messages arrived, once the connection's earlier
// traffic is flushed through.
func (c *stateCount) pending(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	n, _, err := c.sub.Pending()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// beat is the time JetStream stored the tier's lease last.
func beat(t *testing.T, nc *nats.Conn, tier string) time.Time {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketTiers)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx(t), tier)
	if err != nil {
		t.Fatalf("tier lease %s: %v", tier, err)
	}
	return e.Created()
}

// A node under a tier's lease is online while the lease is alive: its
// lapse takes the tier's nodes offline, with the tier's last heartbeat
// as their last_seen and no write of theirs; its return brings them back.
func TestPresenceTierLapse(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	w := watch(t, r)
	w.waitReady(t)
	a := holdTier(t, r, "tier-a")
	other := holdTier(t, r, "tier-b")
	n1, n2, n3 := newNode("s1"), newNode("s2"), newNode("s3")
	tierClaim(t, a, n1)
	tierClaim(t, a, n2)
	tierClaim(t, other, n3)
	for range 3 {
		if ev := w.next(t); ev.Node == nil || ev.Node.Offline() || !ev.Node.TierLease {
			t.Fatalf("claimed: %+v, want an online record under a tier lease", ev)
		}
	}
	// Tier b's heartbeats go on, and tell the watch nothing.
	nodes := countState(t, nc, bus.BucketNodes)
	last := beat(t, nc, "tier-a")
	lapsed := map[string]time.Time{}
	deadline := time.After(eventTimeout)
	for len(lapsed) < 2 {
		if _, err := other.Refresh(ctx(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-w.events:
			if ev.NodeID == n3.NodeID {
				t.Fatalf("tier b's node changed on its heartbeat: %+v", ev)
			}
			if ev.Node == nil || !ev.Node.Offline() || !ev.Expired {
				t.Fatalf("tier a lapsed: %+v, want its node offline, expired", ev)
			}
			lapsed[ev.NodeID] = ev.Node.LastSeen
		case <-time.After(300 * time.Millisecond): // a heartbeat's period, not a wait for an outcome
		case <-deadline:
			t.Fatal("tier a's lease never lapsed")
		}
	}
	for _, id := range []string{n1.NodeID, n2.NodeID} {
		if got, ok := lapsed[id]; !ok || !got.Equal(last.UTC()) {
			t.Errorf("node %s last seen %v, want tier a's last heartbeat %v", id, got, last)
		}
	}
	if n := nodes.pending(t, nc); n != 0 {
		t.Errorf("the lapse wrote %d node records, want none", n)
	}
	// The lease comes back: its holder learns it lapsed; its nodes are
	// online again, as they were.
	back, err := a.Refresh(ctx(t))
	if err != nil || !back {
		t.Fatalf("Refresh after the lapse: %v, %v; want lapsed", back, err)
	}
	for range 2 {
		ev := w.next(t)
		if ev.Node == nil || ev.Node.Offline() || ev.Node.SessionID != map[string]string{n1.NodeID: "s1", n2.NodeID: "s2"}[ev.NodeID] {
			t.Fatalf("tier a back: %+v, want its nodes online", ev)
		}
	}
	// A watch started now sees the same.
	w2 := watch(t, r)
	w2.waitReady(t)
	if len(w2.events) != 3 {
		t.Fatalf("a new watch saw %d records, want 3", len(w2.events))
	}
	for range 3 {
		if ev := w2.next(t); !ev.Initial || ev.Node == nil || ev.Node.Offline() {
			t.Errorf("a new watch: %+v, want every node online", ev)
		}
	}
}

// A tier that stops cleanly releases its lease: its nodes whose records
// still say online (their sessions could not write) go offline at once.
// A watch started after a tier's lease lapsed sees its nodes offline,
// and a node's next session, on another tier, online.
func TestPresenceTierRelease(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	w := watch(t, r)
	w.waitReady(t)
	a := holdTier(t, r, "tier-a")
	n := newNode("s1")
	tierClaim(t, a, n)
	if ev := w.next(t); ev.Node == nil || ev.Node.Offline() {
		t.Fatalf("claimed: %+v", ev)
	}
	if err := a.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	ev := w.next(t)
	if ev.Node == nil || !ev.Node.Offline() || ev.Expired {
		t.Fatalf("tier released: %+v, want the node offline, not expired", ev)
	}
	if ev.Node.LastSeen.IsZero() {
		t.Error("no last_seen")
	}

	w2 := watch(t, r)
	if ev := w2.next(t); ev.Node == nil || !ev.Node.Offline() || !ev.Initial {
		t.Fatalf("a new watch after the tier left: %+v, want the node offline", ev)
	}
	w2.waitReady(t)
	b := holdTier(t, r, "tier-b")
	n.SessionID = "s2"
	tierClaim(t, b, n)
	for _, w := range []*watcher{w, w2} {
		if ev := w.next(t); ev.Node == nil || ev.Node.Offline() || ev.Node.SessionID != "s2" || ev.Node.Tier != "tier-b" {
			t.Fatalf("the next session: %+v, want it online on tier b", ev)
		}
	}
}

// An older okso's record is its own lease: a watch takes it as it is,
// whatever the tiers' leases, and sees it go when it expires.
func TestPresenceOlderRecords(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	n := newNode("s1")
	n.Tier = "tier-old" // which holds no lease
	claim(t, r, n)
	w := watch(t, r)
	ev := w.next(t)
	if ev.Node == nil || ev.Node.Offline() || ev.Node.TierLease {
		t.Fatalf("an older okso's record: %+v, want it online as it is", ev)
	}
	w.waitReady(t)
	if ev := w.next(t); ev.Node != nil || !ev.Expired {
		t.Fatalf("its lease ran out: %+v, want it gone, expired", ev)
	}
}

// A session's record under its tier's lease is rewritten only if it is
// still the one it wrote, and a tier's lease only by its holder's
// refresh.
func TestTierLeaseChecks(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	if _, err := r.HoldTier(ctx(t), "tier.a"); !errors.Is(err, bus.ErrBadTier) {
		t.Errorf("a tier id with a dot: %v, want ErrBadTier", err)
	}
	a := holdTier(t, r, "tier-a")
	n := newNode("s1")
	old := tierClaim(t, a, n)
	if err := old.Refresh(ctx(t)); err != nil {
		t.Fatalf("Refresh of its own record: %v", err)
	}
	n.SessionID = "s2"
	tierClaim(t, a, n)
	if err := old.Refresh(ctx(t)); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("Refresh over a newer session's record: %v, want ErrLeaseLost", err)
	}
	late := n
	late.SessionID = "s1"
	if _, err := a.Claim(ctx(t), late); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("an older session's claim after a newer one's: %v, want ErrLeaseLost", err)
	}
	if err := old.Leave(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	got, err := r.Get(ctx(t), n.NodeID)
	if err != nil || got == nil || got.Offline() || got.SessionID != "s2" {
		t.Fatalf("the newer session's record after the older one left: %+v, %v", got, err)
	}
	if lapsed, err := a.Refresh(ctx(t)); err != nil || lapsed {
		t.Errorf("Refresh within the TTL: %v, %v; want not lapsed", lapsed, err)
	}
}

// On an install an older okso made, the tiers' bucket is missing: a role
// that may not make buckets is told to run okso nats init, which makes
// it (InitState), and the role then opens the registry.
func TestInitStateMakesTiers(t *testing.T) {
	_, nc := startBus(t)
	if err := bus.InitState(ctx(t), nc, bus.StateOptions{}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx(t), bus.BucketTiers); err != nil { // as an older okso left it
		t.Fatal(err)
	}
	if _, err := bus.OpenRegistry(ctx(t), nc, bus.RegistryOptions{BindOnly: true}); !errors.Is(err, bus.ErrNoBucket) {
		t.Fatalf("a role opens the registry of an older install: %v, want ErrNoBucket", err)
	}
	if err := bus.InitState(ctx(t), nc, bus.StateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.OpenRegistry(ctx(t), nc, bus.RegistryOptions{BindOnly: true}); err != nil {
		t.Fatalf("a role opens the registry after okso nats init: %v", err)
	}
}

// sweepFor runs l.Sweep with an index kept from a raw watch of r, until
// the test ends.
func sweepFor(t *testing.T, r *bus.Registry, l *bus.TierLease) { sweepWith(t, r, l, nil) }

// sweepWith is sweepFor for a tier that keeps bindings in b.
func sweepWith(t *testing.T, r *bus.Registry, l *bus.TierLease, b *bus.Bindings) {
	t.Helper()
	idx := bus.NewOrphans()
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- r.WatchRaw(c, func(id string, v []byte, _ bool) { idx.Apply(id, v) }, idx.Loaded) }()
	go func() { done <- l.Sweep(c, idx, b, nil) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("sweep or its watch: %v", err)
			}
		}
	})
}

// keepAlive refreshes l as its tier would, until the test ends.
func keepAlive(t *testing.T, l *bus.TierLease) {
	t.Helper()
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.Done():
				return
			case <-tick.C:
				if _, err := l.Refresh(c); err != nil && c.Err() == nil {
					t.Errorf("refresh %s: %v", l.ID(), err)
					return
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// writes counts the republished messages of each key of okso_nodes.
func writes(t *testing.T, nc *nats.Conn) func() map[string]int {
	t.Helper()
	sub, err := nc.SubscribeSync("okso.v1.state." + bus.BucketNodes + ".>")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	return func() map[string]int {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := sub.NextMsg(0)
			if err != nil {
				return counts
			}
			counts[strings.TrimPrefix(m.Subject, "okso.v1.state."+bus.BucketNodes+".")]++
		}
	}
}

// A live tier marks offline, once, the records a dead tier left online,
// as of its last heartbeat; they then expire after the offline
// retention. Records of live tiers, older okso's, and offline ones are
// left alone.
func TestSweepOrphans(t *testing.T) {
	_, nc := startBus(t)
	short := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	long := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Minute, OfflineRetention: 2 * time.Second})
	doomed := holdTier(t, short, "tier-doomed")
	live := holdTier(t, long, "tier-live")
	orphan1, orphan2, left, kept, old := newNode("s1"), newNode("s2"), newNode("s3"), newNode("s4"), newNode("s5")
	tierClaim(t, doomed, orphan1)
	tierClaim(t, doomed, orphan2)
	if err := tierClaim(t, doomed, left).Leave(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	tierClaim(t, live, kept)
	claim(t, long, old) // an older okso's: its own lease, a minute
	count := writes(t, nc)
	w := watch(t, long)
	w.waitReady(t)
	last := beat(t, nc, "tier-doomed")
	sweepFor(t, long, live)

	// Every watch takes them offline when the lease lapses (expired);
	// then the live tier writes them offline.
	swept := map[string]bool{}
	for len(swept) < 2 {
		e := w.next(t)
		if e.Initial {
			continue
		}
		if e.NodeID != orphan1.NodeID && e.NodeID != orphan2.NodeID {
			t.Fatalf("%+v changed", e)
		}
		if e.Node == nil || !e.Node.Offline() {
			t.Fatalf("%s: %+v, want it offline", e.NodeID, e.Node)
		}
		if !e.Expired {
			swept[e.NodeID] = true
			if !e.Node.LastSeen.Equal(last.UTC()) {
				t.Errorf("%s swept with last_seen %v, want the dead tier's last heartbeat %v", e.NodeID, e.Node.LastSeen, last)
			}
		}
	}
	// Then they expire; nothing else was written.
	for gone := 0; gone < 2; {
		if e := w.next(t); e.Node == nil && (e.NodeID == orphan1.NodeID || e.NodeID == orphan2.NodeID) {
			gone++
		}
	}
	got := count()
	want := map[string]int{orphan1.NodeID: 2, orphan2.NodeID: 2} // marked offline, then expired
	if len(got) != len(want) || got[orphan1.NodeID] != 2 || got[orphan2.NodeID] != 2 {
		t.Errorf("writes by key %v, want %v (one sweep and one expiry each)", got, want)
	}
}

// A tier that starts sweeps what tiers that died before it left online,
// whoever ranks highest among the live tiers for each dead one.
func TestSweepAtStart(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	var orphans []bus.Node
	for _, id := range []string{"tier-x", "tier-y", "tier-z"} {
		dead := holdTier(t, r, id)
		n := newNode("s-" + id)
		tierClaim(t, dead, n)
		orphans = append(orphans, n)
		if err := dead.Release(ctx(t)); err != nil { // as if it died, its lease long gone
			t.Fatal(err)
		}
	}
	a, b := holdTier(t, r, "tier-a"), holdTier(t, r, "tier-b")
	keepAlive(t, a)
	keepAlive(t, b)
	sweepFor(t, r, a)
	sweepFor(t, r, b)
	w := watch(t, r)
	for _, n := range orphans {
		for {
			got, err := r.Get(ctx(t), n.NodeID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Offline() {
				break
			}
			w.nextFor(t, n.NodeID) // until its record changes
		}
	}
}

// An older okso kept the registry in memory: opening it to make it
// moves it to file storage with its records, and those who held or
// followed them go on: a session's lease still marks its node offline,
// and a watch sees the changes after the move.
func TestRegistryMovesToFile(t *testing.T) {
	_, nc := startBus(t)
	old := openRegistry(t, nc, bus.RegistryOptions{Memory: true, TTL: time.Minute})
	a := holdTier(t, old, "tier-a")
	online, left, olden := newNode("s1"), newNode("s2"), newNode("s3")
	held := tierClaim(t, a, online)
	if err := tierClaim(t, a, left).Leave(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	claim(t, old, olden)
	w := watch(t, old)
	w.waitReady(t)

	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Minute})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{bus.BucketNodes, bus.BucketTiers} {
		s, err := js.Stream(ctx(t), "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		if b == bus.BucketNodes && s.CachedInfo().Config.Storage != jetstream.FileStorage {
			t.Errorf("%s in %v, want file storage", b, s.CachedInfo().Config.Storage)
		}
	}
	for _, c := range []struct {
		n       bus.Node
		offline bool
	}{{online, false}, {left, true}, {olden, false}} {
		got, err := r.Get(ctx(t), c.n.NodeID)
		if err != nil || got == nil || got.Offline() != c.offline || got.SessionID != c.n.SessionID {
			t.Errorf("record of %s after the move: %+v, %v; want offline %v", c.n.SessionID, got, err, c.offline)
		}
	}
	if err := held.Leave(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	for {
		e := w.nextFor(t, online.NodeID)
		if e.Node != nil && e.Node.Offline() {
			break
		}
	}
	if got, err := r.Get(ctx(t), online.NodeID); err != nil || got == nil || !got.Offline() {
		t.Errorf("the session's record after it left: %+v, %v; want offline", got, err)
	}
}

// A tier whose lease lapsed only for a moment (NATS away from every
// tier at once) takes it again within its TTL and is not swept; one that
// stays gone is.
func TestSweepGrace(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	live := holdTier(t, r, "tier-live")
	keepAlive(t, live)
	flaky, doomed := holdTier(t, r, "tier-flaky"), holdTier(t, r, "tier-doomed")
	nf, nd := newNode("s1"), newNode("s2")
	tierClaim(t, flaky, nf)
	tierClaim(t, doomed, nd)
	w := watch(t, r)
	w.waitReady(t)
	count := writes(t, nc)
	sweepFor(t, r, live)
	for e := w.nextFor(t, nf.NodeID); e.Node == nil || !e.Node.Offline(); e = w.nextFor(t, nf.NodeID) {
	}
	if lapsed, err := flaky.Refresh(ctx(t)); err != nil || !lapsed {
		t.Fatalf("flaky tier takes its lease again: %v, %v", lapsed, err)
	}
	keepAlive(t, flaky)
	sweepFor(t, r, flaky) // a live tier: it may rank highest for the dead one
	for {
		got, err := r.Get(ctx(t), nd.NodeID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Offline() {
			break
		}
		w.nextFor(t, nd.NodeID)
	}
	if n := count()[nf.NodeID]; n != 0 {
		t.Errorf("the flaky tier's node was written %d times, want none", n)
	}
	if got, err := r.Get(ctx(t), nf.NodeID); err != nil || got.Offline() {
		t.Errorf("the flaky tier's node: %+v, %v; want online", got, err)
	}
}

// A live tier that sweeps a dead tier's nodes gives their bindings the
// TTL, as their sessions would have at their end; a node whose device is
// back, on another tier, keeps its binding without one: the record it
// claimed is not the dead tier's, or, not claimed yet, the binding is
// the newer session's.
func TestSweepReleasesBindings(t *testing.T) {
	_, nc := startBus(t)
	short := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	long := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Minute})
	b := openBindings(t, nc, bus.BindingsOptions{})
	doomed := holdTier(t, short, "tier-doomed")
	live := holdTier(t, long, "tier-live")
	orphan, binding, back := newNode("s1"), newNode("s2"), newNode("s3")
	for _, n := range []*bus.Node{&orphan, &binding, &back} {
		n.BindingRev = wantBind(t, b, n.NodeID, n.Tenant)
		tierClaim(t, doomed, *n)
	}
	// Two devices are back on the live tier before the sweep: one bound
	// its node id, the other also claimed the node.
	binding.SessionID, back.SessionID = "s4", "s5"
	binding.BindingRev = wantBind(t, b, binding.NodeID, binding.Tenant)
	back.BindingRev = wantBind(t, b, back.NodeID, back.Tenant)
	tierClaim(t, live, back)
	w := watch(t, long)
	w.waitReady(t)
	sweepWith(t, long, live, b)

	for swept := map[string]bool{orphan.NodeID: true, binding.NodeID: true}; len(swept) > 0; {
		// Until each record is marked offline by the sweep (not just seen
		// offline at its tier's lapse).
		if e := w.next(t); swept[e.NodeID] && e.Node != nil && e.Node.Offline() && !e.Expired {
			delete(swept, e.NodeID)
		}
	}
	if ttl, _ := bindingTTL(t, nc, orphan.NodeID); ttl == "" {
		t.Errorf("the swept node's binding has no TTL")
	}
	for _, n := range []bus.Node{binding, back} {
		if ttl, rev := bindingTTL(t, nc, n.NodeID); ttl != "" || rev != n.BindingRev {
			t.Errorf("the binding of node %s, back: TTL %q, revision %d; want none, %d", n.SessionID, ttl, rev, n.BindingRev)
		}
	}
	if r, err := long.Get(ctx(t), back.NodeID); err != nil || r.Offline() || r.Tier != "tier-live" {
		t.Errorf("the record of the node back on the live tier: %+v, %v", r, err)
	}
}

// ClaimNew writes a node's record where there is none; where there is
// one after all, it judges it as Claim does: a newer session's stays,
// an older one's is replaced.
func TestClaimNew(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	l := holdTier(t, r, "tier-1")
	n := newNode("s2")
	if _, err := l.ClaimNew(ctx(t), n); err != nil {
		t.Fatalf("ClaimNew of a node with no record: %v", err)
	}
	older := n
	older.SessionID = "s1"
	if _, err := l.ClaimNew(ctx(t), older); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("ClaimNew of an older session: %v, want ErrLeaseLost", err)
	}
	if got, err := r.Get(ctx(t), n.NodeID); err != nil || got.SessionID != "s2" {
		t.Fatalf("record after an older session's ClaimNew: %+v, %v; want s2's", got, err)
	}
	newer := n
	newer.SessionID = "s3"
	if _, err := l.ClaimNew(ctx(t), newer); err != nil {
		t.Fatalf("ClaimNew of a newer session: %v", err)
	}
	if got, err := r.Get(ctx(t), n.NodeID); err != nil || got.SessionID != "s3" {
		t.Fatalf("record after a newer session's ClaimNew: %+v, %v; want s3's", got, err)
	}
}
