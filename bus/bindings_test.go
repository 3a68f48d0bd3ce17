package bus_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
)

func openBindings(t *testing.T, nc *nats.Conn, opts bus.BindingsOptions) *bus.Bindings {
	t.Helper()
	b, err := bus.OpenBindings(ctx(t), nc, opts)
	if err != nil {
		t.Fatalf("OpenBindings: %v", err)
	}
	return b
}

func bindingsKV(t *testing.T, nc *nats.Conn) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketNodeTenants)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// wantBind binds node to tenant, fails the test unless that succeeds, and
// returns the revision it wrote.
func wantBind(t *testing.T, b *bus.Bindings, node, tenant string) uint64 {
	t.Helper()
	owner, rev, err := b.Bind(ctx(t), node, tenant)
	if err != nil || owner != tenant || rev == 0 {
		t.Fatalf("Bind(%s, %s) = %q, %d, %v; want it bound", node, tenant, owner, rev, err)
	}
	return rev
}

// wantRefused binds node to tenant and fails the test unless owner holds it.
func wantRefused(t *testing.T, b *bus.Bindings, node, tenant, owner string) {
	t.Helper()
	if got, _, err := b.Bind(ctx(t), node, tenant); !errors.Is(err, bus.ErrOtherTenant) || got != owner {
		t.Fatalf("Bind(%s, %s) = %q, %v; want %s's, ErrOtherTenant", node, tenant, got, err, owner)
	}
}

// The first tenant owns a node id; another is refused, from any replica,
// and its attempt changes nothing.
func TestBindingsFirstTenantOwns(t *testing.T) {
	srv, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{})
	if b.TTL() != bus.DefaultBindingTTL {
		t.Errorf("TTL %v, want 24h", b.TTL())
	}
	b2 := openBindings(t, connect(t, srv, "replica-2"), bus.BindingsOptions{TTL: time.Minute})
	kv := bindingsKV(t, nc)
	node := newNode("s").NodeID

	wantBind(t, b, node, "demo")
	first, err := kv.Get(ctx(t), node)
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, b2, node, "evil", "demo")
	wantRefused(t, b, node, "evil", "demo")
	if e, err := kv.Get(ctx(t), node); err != nil || e.Revision() != first.Revision() {
		t.Fatalf("binding after refusals: %v, %v; want revision %d untouched", e, err, first.Revision())
	}
	// The owner again, from the other replica: written again, not refused.
	wantBind(t, b2, node, "demo")
	if e, err := kv.Get(ctx(t), node); err != nil || e.Revision() == first.Revision() || string(e.Value()) != "demo" {
		t.Fatalf("binding after the owner's second session: %v, %v; want a new revision for demo", e, err)
	}
	if owner, err := b2.Owner(ctx(t), node); err != nil || owner != "demo" {
		t.Errorf("Owner = %q, %v; want demo", owner, err)
	}
	if owner, err := b2.Owner(ctx(t), newNode("s").NodeID); err != nil || owner != "" {
		t.Errorf("Owner of a free node id = %q, %v; want none", owner, err)
	}
}

// Many tenants binding the same free node ids at once, through several
// connections: exactly one tenant owns each, and every other was refused
// with that owner's name.
func TestBindingsRace(t *testing.T) {
	srv, _ := startBus(t)
	var replicas []*bus.Bindings
	for i := range 4 {
		replicas = append(replicas, openBindings(t, connect(t, srv, "replica-"+strconv.Itoa(i)), bus.BindingsOptions{}))
	}
	for round := range 20 {
		node := newNode("s").NodeID
		type result struct {
			tenant, owner string
			err           error
		}
		results := make(chan result, 8)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 8 {
			tenant := "t" + strconv.Itoa(i)
			b := replicas[i%len(replicas)]
			wg.Go(func() {
				<-start
				owner, _, err := b.Bind(ctx(t), node, tenant)
				results <- result{tenant, owner, err}
			})
		}
		close(start)
		wg.Wait()
		close(results)
		winners, owner := 0, ""
		var refused []result
		for r := range results {
			switch {
			case r.err == nil:
				winners++
				owner = r.tenant
			case errors.Is(r.err, bus.ErrOtherTenant):
				refused = append(refused, r)
			default:
				t.Fatalf("round %d: Bind for %s: %v", round, r.tenant, r.err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d tenants bound the node id, want 1", round, winners)
		}
		for _, r := range refused {
			if r.owner != owner {
				t.Fatalf("round %d: %s refused in favour of %q, but %s won", round, r.tenant, r.owner, owner)
			}
		}
	}
}

// A binding outlives its last session by its TTL: held, it stays however
// long; released, it expires and the node id is free for anyone.
func TestBindingsExpire(t *testing.T) {
	_, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{TTL: time.Second})
	node := newNode("s").NodeID
	changes := bindingWrites(t, nc, node)

	rev := wantBind(t, b, node, "demo")
	changes.next(t) // the bind
	// Three TTLs go by (the tier's lease heartbeats are the clock): the
	// binding stays, and nothing writes it.
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	keepAlive(t, holdTier(t, r, "tier-clock"))
	beats := beats(t, nc, "tier-clock")
	for range 9 {
		beats.next(t)
	}
	changes.none(t)
	if ttl, got := bindingTTL(t, nc, node); ttl != "" || got != rev {
		t.Fatalf("held binding: TTL %q, revision %d; want none, %d", ttl, got, rev)
	}
	wantRefused(t, b, node, "evil", "demo")

	if err := b.Release(ctx(t), node, "demo", rev); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := bindingTTL(t, nc, node); ttl != "1s" {
		t.Fatalf("released binding: TTL %q, want 1s", ttl)
	}
	changes.next(t) // the release
	if m := changes.next(t); m.Header.Get("KV-Operation") == "" && m.Header.Get("Nats-Marker-Reason") == "" {
		t.Fatalf("after the release: %v, want the binding's expiry", m.Header)
	}
	wantBind(t, b, node, "evil")
}

// An operator frees a node id by deleting its key.
func TestBindingsDeletedByOperator(t *testing.T) {
	_, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{})
	node := newNode("s").NodeID
	wantBind(t, b, node, "demo")
	if err := bindingsKV(t, nc).Delete(ctx(t), node); err != nil {
		t.Fatal(err)
	}
	wantBind(t, b, node, "evil")
	wantRefused(t, b, node, "demo", "evil")
}

// A node id without a binding but with a live registry record (as a tier
// older than bindings writes it) belongs to the record's tenant, and
// refusing another writes no binding.
func TestBindingsFallBackOnRegistry(t *testing.T) {
	_, nc := startBus(t)
	reg := openRegistry(t, nc, bus.RegistryOptions{})
	b := openBindings(t, nc, bus.BindingsOptions{Registry: reg})
	n := newNode("s") // of tenant acme
	claim(t, reg, n)

	wantRefused(t, b, n.NodeID, "evil", "acme")
	if owner, err := b.Owner(ctx(t), n.NodeID); err != nil || owner != "" {
		t.Fatalf("Owner after the refusal = %q, %v; want still free", owner, err)
	}
	wantBind(t, b, n.NodeID, "acme")
	if owner, err := b.Owner(ctx(t), n.NodeID); err != nil || owner != "acme" {
		t.Fatalf("Owner = %q, %v; want acme", owner, err)
	}
}

func TestOpenBindingsRefusesSubSecondTTL(t *testing.T) {
	_, nc := startBus(t)
	c, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()
	if _, err := bus.OpenBindings(c, nc, bus.BindingsOptions{TTL: 500 * time.Millisecond}); err == nil {
		t.Fatal("OpenBindings took a 500ms TTL")
	}
}

// A registry record okso did not write, under a free node id, belongs to
// no tenant: the node id binds.
func TestBindingsIgnoreBadRecords(t *testing.T) {
	_, nc := startBus(t)
	reg := openRegistry(t, nc, bus.RegistryOptions{})
	b := openBindings(t, nc, bus.BindingsOptions{Registry: reg})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	node := newNode("s").NodeID
	if _, err := kv.Put(ctx(t), node, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	wantBind(t, b, node, "demo")
}

// published follows the messages published on one subject.
type published struct {
	nc  *nats.Conn
	sub *nats.Subscription
}

func follow(t *testing.T, nc *nats.Conn, subject string) *published {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &published{nc, sub}
}

// bindingWrites follows the writes of node's binding (and its markers).
func bindingWrites(t *testing.T, nc *nats.Conn, node string) *published {
	return follow(t, nc, "okso.v1.state."+bus.BucketNodeTenants+"."+node)
}

// beats follows the heartbeats of a tier's lease.
func beats(t *testing.T, nc *nats.Conn, tier string) *published {
	return follow(t, nc, "okso.v1.state."+bus.BucketTiers+"."+tier)
}

func (p *published) next(t *testing.T) *nats.Msg {
	t.Helper()
	m, err := p.sub.NextMsg(eventTimeout)
	if err != nil {
		t.Fatalf("next message on %s: %v", p.sub.Subject, err)
	}
	return m
}

// none fails the test if anything was published, once the connection's
// earlier traffic is flushed through.
func (p *published) none(t *testing.T) {
	t.Helper()
	if err := p.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := p.sub.Pending(); n != 0 {
		m, _ := p.sub.NextMsg(0)
		t.Fatalf("%d messages on %s, want none; the first: %v %q", n, p.sub.Subject, m.Header, m.Data)
	}
}

// bindingTTL returns the TTL of node's binding as stored (its message's
// Nats-TTL header; "" for none) and the binding's revision.
func bindingTTL(t *testing.T, nc *nats.Conn, node string) (string, uint64) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx(t), "KV_"+bus.BucketNodeTenants)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx(t), "$KV."+bus.BucketNodeTenants+"."+node)
	if err != nil {
		t.Fatalf("binding of %s: %v", node, err)
	}
	return m.Header.Get(jetstream.MsgTTLHeader), m.Sequence
}

// A session's end gives its binding the TTL only while no newer session
// wrote the binding: the release of a session that was replaced changes
// nothing, whether it comes before or after the newer session's bind.
func TestBindingsReleaseOnlyOwnRevision(t *testing.T) {
	srv, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{})
	b2 := openBindings(t, connect(t, srv, "replica-2"), bus.BindingsOptions{})
	node := newNode("s").NodeID

	old := wantBind(t, b, node, "demo")
	// The newer session reads the binding, the older one ends, then the
	// newer one writes: its write expected the revision it read, and
	// reads again.
	owner, seen, err := b2.Check(ctx(t), node, "demo")
	if err != nil || owner != "demo" || seen != old {
		t.Fatalf("Check = %q, %d, %v; want demo's, revision %d", owner, seen, err, old)
	}
	if err := b.Release(ctx(t), node, "demo", old); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := bindingTTL(t, nc, node); ttl == "" {
		t.Fatal("the released binding has no TTL")
	}
	_, newer, err := b2.Hold(ctx(t), node, "demo", seen)
	if err != nil {
		t.Fatal(err)
	}
	if ttl, rev := bindingTTL(t, nc, node); ttl != "" || rev != newer {
		t.Fatalf("held again: TTL %q, revision %d; want none, %d", ttl, rev, newer)
	}
	// The older session's release again, after the newer one's bind.
	if err := b.Release(ctx(t), node, "demo", old); err != nil {
		t.Fatal(err)
	}
	if ttl, rev := bindingTTL(t, nc, node); ttl != "" || rev != newer {
		t.Fatalf("after a stale release: TTL %q, revision %d; want none, %d", ttl, rev, newer)
	}
	// A third session binds while the second holds the node: the second's
	// release then loses too.
	third := wantBind(t, b, node, "demo")
	if err := b2.Release(ctx(t), node, "demo", newer); err != nil {
		t.Fatal(err)
	}
	if ttl, rev := bindingTTL(t, nc, node); ttl != "" || rev != third {
		t.Fatalf("after the second's release: TTL %q, revision %d; want none, %d", ttl, rev, third)
	}
	if err := b.Release(ctx(t), node, "demo", third); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := bindingTTL(t, nc, node); ttl != "24h0m0s" && ttl != "86400s" {
		t.Fatalf("after the last session's release: TTL %q, want 24h", ttl)
	}
}

// Rehold, for a session whose tier's lease lapsed: an untouched binding
// is not written; one a sweep released is held again; one a newer
// session holds is left to it.
func TestBindingsRehold(t *testing.T) {
	_, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{})
	node := newNode("s").NodeID
	rev := wantBind(t, b, node, "demo")
	writes := bindingWrites(t, nc, node)

	if _, got, err := b.Rehold(ctx(t), node, "demo", rev); err != nil || got != rev {
		t.Fatalf("Rehold of an untouched binding = %d, %v; want %d", got, err, rev)
	}
	writes.none(t)

	if err := b.Release(ctx(t), node, "demo", rev); err != nil { // the sweep
		t.Fatal(err)
	}
	_, again, err := b.Rehold(ctx(t), node, "demo", rev)
	if err != nil || again <= rev {
		t.Fatalf("Rehold of a released binding = %d, %v; want a new revision", again, err)
	}
	if ttl, got := bindingTTL(t, nc, node); ttl != "" || got != again {
		t.Fatalf("held again: TTL %q, revision %d; want none, %d", ttl, got, again)
	}

	newer := wantBind(t, b, node, "demo") // a newer session, on any tier
	if _, _, err := b.Rehold(ctx(t), node, "demo", again); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("Rehold of a newer session's binding: %v, want ErrLeaseLost", err)
	}
	if ttl, got := bindingTTL(t, nc, node); ttl != "" || got != newer {
		t.Fatalf("the newer session's binding: TTL %q, revision %d; want none, %d", ttl, got, newer)
	}
}
