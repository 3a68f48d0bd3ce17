package bus_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// eventTimeout bounds every wait for a registry event; it is a failure
// deadline, not a synchronisation delay.
const eventTimeout = 15 * time.Second

// startBus starts a fresh embedded server and connects to it. Both are
// closed when the test ends.
func startBus(t *testing.T) (*bus.Server, *nats.Conn) {
	t.Helper()
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatalf("StartServer: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	return srv, connect(t, srv, t.Name())
}

func connect(t *testing.T, srv *bus.Server, name string) *nats.Conn {
	t.Helper()
	nc, err := srv.Connect(name)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func openRegistry(t *testing.T, nc *nats.Conn, opts bus.RegistryOptions) *bus.Registry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	r, err := bus.OpenRegistry(ctx, nc, opts)
	if err != nil {
		t.Fatalf("OpenRegistry: %v", err)
	}
	return r
}

// watcher runs Registry.Watch until the test ends and checks it returns
// the context's error.
type watcher struct {
	events chan bus.Event
	ready  chan struct{}
}

func watch(t *testing.T, r *bus.Registry) *watcher {
	t.Helper()
	w := &watcher{events: make(chan bus.Event, 64), ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	readyCalls := 0
	go func() {
		done <- r.Watch(ctx, func(e bus.Event) {
			select {
			case w.events <- e:
			case <-ctx.Done():
			}
		}, func() {
			readyCalls++
			if readyCalls == 1 {
				close(w.ready)
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Watch returned %v, want context.Canceled", err)
			}
		case <-time.After(eventTimeout):
			t.Error("Watch did not return after cancel")
		}
		if readyCalls != 1 {
			t.Errorf("ready called %d times, want 1", readyCalls)
		}
	})
	return w
}

func (w *watcher) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-w.ready:
	case <-time.After(eventTimeout):
		t.Fatal("watch never became ready")
	}
}

func (w *watcher) next(t *testing.T) bus.Event {
	t.Helper()
	select {
	case e := <-w.events:
		return e
	case <-time.After(eventTimeout):
		t.Fatal("no registry event")
		return bus.Event{}
	}
}

// nextFor skips events of other nodes.
func (w *watcher) nextFor(t *testing.T, nodeID string) bus.Event {
	t.Helper()
	for {
		if e := w.next(t); e.NodeID == nodeID {
			return e
		}
	}
}

func newNode(session string) bus.Node {
	return bus.Node{
		NodeID:    strings.ToLower(ulid.Make().String()),
		Tenant:    "acme",
		SessionID: session,
		State:     bus.StateOnline, // as Claim writes it
		Tier:      "tier-1",
		Agent:     schemas.Agent{Name: "okso-mock", Version: "0.1.0"},
		Capabilities: []schemas.Capability{{
			CapID:       "echo",
			Kind:        "system.echo",
			SchemaRef:   "mcp://schemas/system.echo.invoke.input@1.0.0",
			Verbs:       []string{"invoke"},
			SafetyClass: "read_only",
			Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000},
		}},
		ConnectedAt: time.Now().UTC().Truncate(time.Millisecond),
	}
}

func claim(t *testing.T, r *bus.Registry, n bus.Node) *bus.Lease {
	t.Helper()
	l, err := r.Claim(ctx(t), n)
	if err != nil {
		t.Fatalf("Claim %s: %v", n.NodeID, err)
	}
	return l
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), eventTimeout)
	t.Cleanup(cancel)
	return c
}

func sameNode(t *testing.T, got *bus.Node, want bus.Node) {
	t.Helper()
	if got == nil {
		t.Fatalf("node %s: got removal, want record", want.NodeID)
	}
	g := *got
	if !g.ConnectedAt.Equal(want.ConnectedAt) {
		t.Errorf("connected_at %v, want %v", g.ConnectedAt, want.ConnectedAt)
	}
	g.ConnectedAt = want.ConnectedAt
	if !reflect.DeepEqual(g, want) {
		t.Errorf("record\n got %+v\nwant %+v", g, want)
	}
}

func TestRegistryClaimWatchRelease(t *testing.T) {
	srv, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	if r.TTL() != 15*time.Second {
		t.Errorf("default TTL %v, want 15s", r.TTL())
	}

	n1 := newNode("s1")
	l1 := claim(t, r, n1)

	// Initial state: the record claimed before the watch began.
	w := watch(t, r)
	e := w.next(t)
	if e.NodeID != n1.NodeID || !e.Initial {
		t.Fatalf("first event %+v, want initial %s", e, n1.NodeID)
	}
	sameNode(t, e.Node, n1)
	w.waitReady(t)

	// A second replica, on its own connection, opens the same bucket.
	r2 := openRegistry(t, connect(t, srv, "replica-2"), bus.RegistryOptions{})
	w2 := watch(t, r2)
	if e := w2.next(t); e.NodeID != n1.NodeID || !e.Initial || e.Node == nil {
		t.Fatalf("replica 2 first event %+v", e)
	}
	w2.waitReady(t)

	// Live: a new claim, made through the other replica.
	n2 := newNode("s2")
	l2 := claim(t, r2, n2)
	for _, w := range []*watcher{w, w2} {
		e := w.next(t)
		if e.NodeID != n2.NodeID || e.Initial {
			t.Fatalf("live event %+v, want %s not initial", e, n2.NodeID)
		}
		sameNode(t, e.Node, n2)
	}

	// Refresh keeps the record: it is rewritten, unchanged.
	if err := l1.Refresh(ctx(t)); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	for _, w := range []*watcher{w, w2} {
		e := w.next(t)
		if e.NodeID != n1.NodeID || e.Initial {
			t.Fatalf("event after refresh %+v", e)
		}
		sameNode(t, e.Node, n1)
	}

	// Release removes it.
	if err := l1.Release(ctx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, w := range []*watcher{w, w2} {
		if e := w.next(t); e.NodeID != n1.NodeID || e.Node != nil || e.Initial || e.Expired {
			t.Fatalf("event after release %+v, want removal of %s", e, n1.NodeID)
		}
	}
	// A released lease is gone for good.
	if err := l1.Refresh(ctx(t)); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("Refresh after Release: %v, want ErrLeaseLost", err)
	}
	if err := l1.Release(ctx(t)); err != nil {
		t.Errorf("second Release: %v", err)
	}

	// A watch that starts now sees only the live node.
	w3 := watch(t, r)
	if e := w3.next(t); e.NodeID != n2.NodeID || !e.Initial {
		t.Fatalf("new watch first event %+v, want initial %s", e, n2.NodeID)
	}
	w3.waitReady(t)
	if err := l2.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if e := w3.next(t); e.NodeID != n2.NodeID || e.Node != nil {
		t.Fatalf("event %+v, want removal of %s", e, n2.NodeID)
	}

	// Nothing is present: a new watch is ready at once, with no events for
	// the removal markers left in the bucket.
	w4 := watch(t, r)
	w4.waitReady(t)
	w4.empty(t)
}

// empty checks that no event was delivered. Called after ready, it is
// exact for the initial state: fn runs before ready on Watch's goroutine.
func (w *watcher) empty(t *testing.T) {
	t.Helper()
	select {
	case e := <-w.events:
		t.Fatalf("unexpected event %+v", e)
	default:
	}
}

// A newer session of the same node takes the record; the older lease can
// neither refresh it nor remove it.
func TestRegistryNewerSessionWins(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	w := watch(t, r)
	w.waitReady(t)

	old := newNode("old-session")
	l1 := claim(t, r, old)
	sameNode(t, w.next(t).Node, old)

	newer := old
	newer.SessionID = "new-session"
	newer.Tier = "tier-2"
	l2 := claim(t, r, newer)
	sameNode(t, w.next(t).Node, newer)

	if err := l1.Refresh(ctx(t)); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("old lease Refresh: %v, want ErrLeaseLost", err)
	}
	if err := l1.Release(ctx(t)); err != nil {
		t.Fatalf("old lease Release: %v, want nil", err)
	}
	// The newer record was not touched: its lease still refreshes, which
	// it could not if anything had been written after it.
	if err := l2.Refresh(ctx(t)); err != nil {
		t.Fatalf("newer lease Refresh after the old Release: %v", err)
	}
	e := w.next(t)
	if e.NodeID != old.NodeID || e.Node == nil || e.Node.SessionID != "new-session" {
		t.Fatalf("event %+v, want the newer session's refresh", e)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx(t), old.NodeID)
	if err != nil {
		t.Fatalf("Get after old Release: %v", err)
	}
	if !strings.Contains(string(entry.Value()), `"session_id":"new-session"`) {
		t.Fatalf("record %s, want the new session", entry.Value())
	}

	if err := l2.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if e := w.next(t); e.NodeID != old.NodeID || e.Node != nil {
		t.Fatalf("event %+v, want removal", e)
	}
}

// A record whose lease is not refreshed expires, and watchers see it go.
func TestRegistryExpiry(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	if r.TTL() != time.Second {
		t.Fatalf("TTL %v", r.TTL())
	}
	w := watch(t, r)
	w.waitReady(t)

	n := newNode("s1")
	l := claim(t, r, n)
	claimed := time.Now()
	sameNode(t, w.next(t).Node, n)

	e := w.nextFor(t, n.NodeID)
	if e.Node != nil || !e.Expired {
		t.Fatalf("event %+v, want expiry", e)
	}
	if d := time.Since(claimed); d < r.TTL()-100*time.Millisecond {
		t.Errorf("record expired after %v, before its TTL %v", d, r.TTL())
	}
	if err := l.Refresh(ctx(t)); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("Refresh after expiry: %v, want ErrLeaseLost", err)
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Errorf("Release after expiry: %v", err)
	}
	// A watch started now does not report the expired node.
	w2 := watch(t, r)
	w2.waitReady(t)
	w2.empty(t)

	// The node can be claimed again.
	l2 := claim(t, r, n)
	sameNode(t, w.nextFor(t, n.NodeID).Node, n)
	if err := l2.Refresh(ctx(t)); err != nil {
		t.Errorf("Refresh of the new claim: %v", err)
	}
}

// A lease refreshed well within its TTL keeps the record alive for several
// TTLs; once refreshing stops, it expires.
func TestRegistryRefreshKeepsAlive(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{TTL: time.Second})
	w := watch(t, r)
	w.waitReady(t)

	n := newNode("s1")
	l := claim(t, r, n)
	sameNode(t, w.next(t).Node, n)

	tick := time.NewTicker(r.TTL() / 4)
	defer tick.Stop()
	until := time.After(3 * r.TTL())
	refreshes := 0
keep:
	for {
		select {
		case <-tick.C:
			if err := l.Refresh(ctx(t)); err != nil {
				t.Fatalf("Refresh %d: %v", refreshes, err)
			}
			refreshes++
		case e := <-w.events:
			if e.Node == nil {
				t.Fatalf("record removed while refreshed (after %d refreshes)", refreshes)
			}
		case <-until:
			break keep
		}
	}
	tick.Stop()
	if refreshes < 4 {
		t.Fatalf("only %d refreshes", refreshes)
	}
	for {
		e := w.nextFor(t, n.NodeID)
		if e.Node == nil {
			break
		}
	}
	if err := l.Refresh(ctx(t)); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("Refresh after expiry: %v, want ErrLeaseLost", err)
	}
}

// Values okso did not write are not reported as nodes.
func TestRegistryWatchIgnoresForeignRecords(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	mismatch := newNode("s")
	other := newNode("s")
	for key, val := range map[string]string{
		"garbage":        "not json",
		mismatch.NodeID:  `{"node_id":"` + other.NodeID + `","tenant":"acme"}`,
		"01hzx9k3m4p7q8": `[1,2,3]`,
	} {
		if _, err := kv.Put(ctx(t), key, []byte(val)); err != nil {
			t.Fatalf("Put %s: %v", key, err)
		}
	}
	w := watch(t, r)
	w.waitReady(t)
	n := newNode("s1")
	claim(t, r, n)
	e := w.next(t)
	if e.NodeID != n.NodeID {
		t.Fatalf("first event %+v, want %s (foreign records must be skipped)", e, n.NodeID)
	}
	sameNode(t, e.Node, n)
}

func TestNodeCapability(t *testing.T) {
	n := newNode("s")
	c, ok := n.Capability("echo")
	if !ok || c.Kind != "system.echo" {
		t.Errorf("Capability(echo) = %+v, %v", c, ok)
	}
	if _, ok := n.Capability("nope"); ok {
		t.Error("Capability(nope) found")
	}
}

// WatchRaw reports records as stored, a refresh as the same bytes again,
// and a removal as a nil value; removal markers of the initial state are
// not reported.
func TestRegistryWatchRaw(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	gone := claim(t, r, newNode("gone"))
	if err := gone.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	type rawEvent struct {
		node    string
		value   []byte
		initial bool
	}
	events := make(chan rawEvent, 16)
	ready := make(chan struct{})
	c, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- r.WatchRaw(c, func(node string, value []byte, initial bool) {
			events <- rawEvent{node, bytes.Clone(value), initial}
		}, func() { close(ready) })
	}()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchRaw returned %v, want context.Canceled", err)
		}
	}()
	select {
	case <-ready:
	case <-time.After(eventTimeout):
		t.Fatal("WatchRaw never became ready")
	}
	next := func() rawEvent {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(eventTimeout):
			t.Fatal("no raw event")
			return rawEvent{}
		}
	}
	n := newNode("s1")
	l := claim(t, r, n)
	first := next()
	if first.node != n.NodeID || first.initial || !bytes.Contains(first.value, []byte(`"session_id":"s1"`)) {
		t.Fatalf("event %+v, want the record of %s", first, n.NodeID)
	}
	if err := l.Refresh(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.node != n.NodeID || !bytes.Equal(e.value, first.value) {
		t.Fatalf("refresh %+v, want the same bytes again", e)
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.node != n.NodeID || e.value != nil {
		t.Fatalf("event %+v, want the removal of %s", e, n.NodeID)
	}
}

// Get returns a node's record, nil when there is none, and ErrBadRecord,
// not "no node", for a record okso did not write: one that is no node,
// or the node of another id.
func TestRegistryGet(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	n := newNode("s")
	claim(t, r, n)
	got, err := r.Get(ctx(t), n.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	sameNode(t, got, n)
	if got, err := r.Get(ctx(t), newNode("s").NodeID); got != nil || err != nil {
		t.Errorf("Get of a node with no record = %v, %v; want nil, nil", got, err)
	}

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	garbage, mismatch := newNode("s"), newNode("s")
	for key, val := range map[string]string{
		garbage.NodeID:  "not json",
		mismatch.NodeID: `{"node_id":"` + n.NodeID + `","tenant":"acme"}`,
	} {
		if _, err := kv.Put(ctx(t), key, []byte(val)); err != nil {
			t.Fatalf("Put %s: %v", key, err)
		}
		if got, err := r.Get(ctx(t), key); got != nil || !errors.Is(err, bus.ErrBadRecord) {
			t.Errorf("Get of %s, stored %s = %v, %v; want ErrBadRecord", key, val, got, err)
		}
	}
}

// TestRegistryLeave: a session that ends marks its node offline rather
// than removing it, for every watcher and for a watch that starts later;
// a session that a newer one replaced writes nothing, whether it ends
// before the newer one claims or after.
func TestRegistryLeave(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	w := watch(t, r)
	w.waitReady(t)

	n := newNode("s1")
	l1 := claim(t, r, n)
	sameNode(t, w.next(t).Node, n)
	left := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	if err := l1.Leave(ctx(t), left); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	offline := n
	offline.State, offline.LastSeen = bus.StateOffline, left
	e := w.next(t)
	if e.NodeID != n.NodeID || e.Expired {
		t.Fatalf("event after Leave %+v, want the offline record", e)
	}
	sameNode(t, e.Node, offline)
	if got, err := r.Get(ctx(t), n.NodeID); err != nil || got == nil || !got.Offline() {
		t.Fatalf("Get after Leave: %+v, %v, want offline", got, err)
	}
	// A lease that left holds nothing.
	if err := l1.Refresh(ctx(t)); !errors.Is(err, bus.ErrLeaseLost) {
		t.Errorf("Refresh after Leave: %v, want ErrLeaseLost", err)
	}
	if err := l1.Release(ctx(t)); err != nil {
		t.Errorf("Release after Leave: %v", err)
	}
	// A watch that starts now (a gateway restarted) sees the node offline.
	w2 := watch(t, r)
	sameNode(t, w2.next(t).Node, offline)
	w2.waitReady(t)

	// The node comes back: online again, and a late Leave of the session
	// that it replaced writes nothing.
	n2 := n
	n2.SessionID = "s2"
	l2 := claim(t, r, n2)
	sameNode(t, w.next(t).Node, n2)
	n3 := n
	n3.SessionID = "s3"
	l3 := claim(t, r, n3)
	sameNode(t, w.next(t).Node, n3)
	if err := l2.Leave(ctx(t), time.Now()); err != nil {
		t.Fatalf("Leave of a replaced session: %v", err)
	}
	if err := l3.Refresh(ctx(t)); err != nil {
		t.Fatalf("newer lease Refresh after the replaced session's Leave: %v", err)
	}
	sameNode(t, w.next(t).Node, n3) // the refresh: nothing came between
	if got, err := r.Get(ctx(t), n.NodeID); err != nil || got == nil || got.Offline() || got.SessionID != "s3" {
		t.Fatalf("Get: %+v, %v, want s3 online", got, err)
	}
}

// TestRegistryOfflineRetention: an offline record expires after the
// offline retention, as a lapse.
func TestRegistryOfflineRetention(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{OfflineRetention: time.Second})
	w := watch(t, r)
	w.waitReady(t)
	n := newNode("s1")
	l := claim(t, r, n)
	w.next(t)
	if err := l.Leave(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	if e := w.next(t); e.Node == nil || !e.Node.Offline() {
		t.Fatalf("event %+v, want offline", e)
	}
	if e := w.next(t); e.NodeID != n.NodeID || e.Node != nil || !e.Expired {
		t.Fatalf("event %+v, want the offline record's expiry", e)
	}
}

// TestRegistryReclaim: a session takes its node's record again only while
// the node has none; a session that claimed the node meanwhile keeps it.
func TestRegistryReclaim(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode("s1")
	claim(t, r, n)
	if _, err := r.Reclaim(ctx(t), n); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("Reclaim over a record: %v, want ErrLeaseLost", err)
	}
	// The record goes (as when its lease lapses): the session takes it again.
	if err := kv.Purge(ctx(t), n.NodeID); err != nil {
		t.Fatal(err)
	}
	l, err := r.Reclaim(ctx(t), n)
	if err != nil {
		t.Fatalf("Reclaim of a node with no record: %v", err)
	}
	if err := l.Refresh(ctx(t)); err != nil {
		t.Fatalf("Refresh of a reclaimed lease: %v", err)
	}
	// It goes again, and a newer session claims the node before the old
	// one tries: the old one does not overwrite it.
	if err := kv.Purge(ctx(t), n.NodeID); err != nil {
		t.Fatal(err)
	}
	newer := n
	newer.SessionID = "s2"
	claim(t, r, newer)
	if _, err := r.Reclaim(ctx(t), n); !errors.Is(err, bus.ErrLeaseLost) {
		t.Fatalf("Reclaim over a newer session: %v, want ErrLeaseLost", err)
	}
	if got, err := r.Get(ctx(t), n.NodeID); err != nil || got == nil || got.SessionID != "s2" {
		t.Fatalf("Get: %+v, %v, want s2", got, err)
	}
}
