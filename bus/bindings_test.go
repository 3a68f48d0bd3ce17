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

// wantBind binds node to tenant and fails the test unless that succeeds.
func wantBind(t *testing.T, b *bus.Bindings, node, tenant string) {
	t.Helper()
	if owner, err := b.Bind(ctx(t), node, tenant); err != nil || owner != tenant {
		t.Fatalf("Bind(%s, %s) = %q, %v; want it bound", node, tenant, owner, err)
	}
}

// wantRefused binds node to tenant and fails the test unless owner holds it.
func wantRefused(t *testing.T, b *bus.Bindings, node, tenant, owner string) {
	t.Helper()
	if got, err := b.Bind(ctx(t), node, tenant); !errors.Is(err, bus.ErrOtherTenant) || got != owner {
		t.Fatalf("Bind(%s, %s) = %q, %v; want %s's, ErrOtherTenant", node, tenant, got, err, owner)
	}
}

// The first tenant owns a node id; another is refused, from any replica,
// and its attempt changes nothing.
func TestBindingsFirstTenantOwns(t *testing.T) {
	srv, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{})
	if b.TTL() != bus.DefaultBindingTTL || b.RefreshEvery() != time.Hour {
		t.Errorf("TTL %v, refresh every %v; want 24h and 1h", b.TTL(), b.RefreshEvery())
	}
	b2 := openBindings(t, connect(t, srv, "replica-2"), bus.BindingsOptions{TTL: time.Minute})
	if b2.RefreshEvery() != 15*time.Second {
		t.Errorf("refresh every %v with a 1m TTL, want 15s", b2.RefreshEvery())
	}
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
	// The owner again, from the other replica: refreshed, not refused.
	wantBind(t, b2, node, "demo")
	if e, err := kv.Get(ctx(t), node); err != nil || e.Revision() == first.Revision() || string(e.Value()) != "demo" {
		t.Fatalf("binding after the owner's refresh: %v, %v; want a new revision for demo", e, err)
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
				owner, err := b.Bind(ctx(t), node, tenant)
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

// A binding outlives nothing but its TTL: refreshed, it stays; left
// alone, it expires and the node id is free for anyone.
func TestBindingsExpire(t *testing.T) {
	_, nc := startBus(t)
	b := openBindings(t, nc, bus.BindingsOptions{TTL: time.Second})
	kv := bindingsKV(t, nc)
	node := newNode("s").NodeID
	w, err := kv.Watch(ctx(t), node, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()

	wantBind(t, b, node, "demo")
	// Refreshed four times a TTL, for three TTLs: never removed.
	tick := time.NewTicker(b.TTL() / 4)
	defer tick.Stop()
	until := time.After(3 * b.TTL())
keep:
	for {
		select {
		case <-tick.C:
			wantBind(t, b, node, "demo")
		case e := <-w.Updates():
			if e != nil && e.Operation() != jetstream.KeyValuePut {
				t.Fatal("binding removed while refreshed")
			}
		case <-until:
			break keep
		}
	}
	tick.Stop()
	wantRefused(t, b, node, "evil", "demo")
	for expired := false; !expired; {
		select {
		case e := <-w.Updates():
			expired = e != nil && e.Operation() != jetstream.KeyValuePut
		case <-time.After(eventTimeout):
			t.Fatal("binding did not expire")
		}
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
