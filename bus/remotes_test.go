package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
)

func openRemotes(t *testing.T, nc *nats.Conn, opts bus.RemotesOptions) *bus.Remotes {
	t.Helper()
	r, err := bus.OpenRemotes(ctx(t), nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type remoteWatcher struct {
	events chan bus.RemoteEvent
	ready  chan struct{}
}

func watchRemotes(t *testing.T, r *bus.Remotes) *remoteWatcher {
	t.Helper()
	w := &remoteWatcher{events: make(chan bus.RemoteEvent, 64), ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- r.Watch(ctx, func(e bus.RemoteEvent) {
			select {
			case w.events <- e:
			case <-ctx.Done():
			}
		}, func() { close(w.ready) })
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
	})
	select {
	case <-w.ready:
	case <-time.After(eventTimeout):
		t.Fatal("watch never became ready")
	}
	return w
}

func (w *remoteWatcher) next(t *testing.T) bus.RemoteEvent {
	t.Helper()
	select {
	case e := <-w.events:
		return e
	case <-time.After(eventTimeout):
		t.Fatal("no remotes event")
		return bus.RemoteEvent{}
	}
}

func remoteRecord(upstream string, tools ...string) *bus.Remote {
	r := &bus.Remote{Upstream: upstream, Transport: "stdio", Tenants: []string{"demo"}, TimeoutMs: 10000}
	for _, name := range tools {
		r.Tools = append(r.Tools, bus.RemoteTool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`),
			Safety: "read_only"})
	}
	return r
}

func TestRemoteCallSubject(t *testing.T) {
	if got := bus.RemoteCall("everything"); got != "okso.v1.remote.everything.call" {
		t.Errorf("RemoteCall = %q", got)
	}
	if bus.QueueRemote != "remote" || bus.BucketRemotes != "okso_remotes" {
		t.Errorf("queue %q, bucket %q", bus.QueueRemote, bus.BucketRemotes)
	}
}

// TestRemoteSeal: the digest names the tool list whatever its order, and
// changes with any tool.
func TestRemoteSeal(t *testing.T) {
	a, b := remoteRecord("u", "b", "a"), remoteRecord("u", "a", "b")
	for _, r := range []*bus.Remote{a, b} {
		if err := r.Seal(); err != nil {
			t.Fatal(err)
		}
	}
	if a.Digest == "" || a.Digest != b.Digest || a.Tools[0].Name != "a" {
		t.Errorf("digests %q, %q; first tool %q", a.Digest, b.Digest, a.Tools[0].Name)
	}
	b.Tools[1].Description = "changed"
	if err := b.Seal(); err != nil {
		t.Fatal(err)
	}
	if a.Digest == b.Digest {
		t.Error("a changed description kept the digest")
	}
}

// TestRemotesPutWatchRelease: records come and go for every watcher; two
// replicas write one key, and a replica's release never removes a record
// the other wrote since.
func TestRemotesPutWatchRelease(t *testing.T) {
	srv, nc := startBus(t)
	r1 := openRemotes(t, nc, bus.RemotesOptions{})
	if r1.TTL() != 15*time.Second {
		t.Errorf("default TTL %v", r1.TTL())
	}
	first := remoteRecord("everything", "echo", "get-sum")
	if err := first.Seal(); err != nil {
		t.Fatal(err)
	}
	rev1, err := r1.Put(ctx(t), first)
	if err != nil {
		t.Fatal(err)
	}

	w := watchRemotes(t, r1)
	r2 := openRemotes(t, connect(t, srv, "replica-2"), bus.RemotesOptions{})
	w2 := watchRemotes(t, r2)

	// Watches started after the put saw it as initial state.
	for _, ww := range []*remoteWatcher{w, w2} {
		e := ww.next(t)
		if !e.Initial || e.Upstream != "everything" || !reflect.DeepEqual(e.Remote, first) {
			t.Fatalf("initial event %+v, want %+v", e, first)
		}
	}

	// The second replica writes the same upstream.
	rev2, err := r2.Put(ctx(t), first)
	if err != nil {
		t.Fatal(err)
	}
	for _, ww := range []*remoteWatcher{w, w2} {
		if e := ww.next(t); e.Initial || e.Remote == nil || e.Remote.Digest != first.Digest {
			t.Fatalf("event %+v, want the second replica's put", e)
		}
	}
	// The first replica cannot list any more and releases: the second's
	// newer record stays.
	if err := r1.Release(ctx(t), "everything", rev1); err != nil {
		t.Fatal(err)
	}
	if e := watchRemotes(t, r1).next(t); !e.Initial || e.Remote == nil {
		t.Fatalf("after a stale release, a new watch starts with %+v, want the record", e)
	}
	// The second releases its own: gone for every watcher.
	if err := r2.Release(ctx(t), "everything", rev2); err != nil {
		t.Fatal(err)
	}
	for _, ww := range []*remoteWatcher{w, w2} {
		if e := ww.next(t); e.Upstream != "everything" || e.Remote != nil || e.Expired {
			t.Fatalf("event %+v, want everything removed (not expired)", e)
		}
	}
	// Releasing again is no error.
	if err := r2.Release(ctx(t), "everything", rev2); err != nil {
		t.Errorf("second release: %v", err)
	}
}

// TestRemotesExpiry: a record no replica puts again expires within its
// TTL, and watchers see it go.
func TestRemotesExpiry(t *testing.T) {
	_, nc := startBus(t)
	r := openRemotes(t, nc, bus.RemotesOptions{TTL: time.Second})
	w := watchRemotes(t, r)
	put := time.Now()
	if _, err := r.Put(ctx(t), remoteRecord("web", "search")); err != nil {
		t.Fatal(err)
	}
	if e := w.next(t); e.Remote == nil {
		t.Fatalf("event %+v, want the put", e)
	}
	if e := w.next(t); e.Upstream != "web" || e.Remote != nil || !e.Expired {
		t.Fatalf("event %+v, want web expired", e)
	}
	if d := time.Since(put); d < time.Second-100*time.Millisecond {
		t.Errorf("expired after %v, before its TTL", d)
	}
}

// TestRemotesForeignRecords: a value okso did not write is no upstream.
func TestRemotesForeignRecords(t *testing.T) {
	_, nc := startBus(t)
	r := openRemotes(t, nc, bus.RemotesOptions{})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx(t), bus.BucketRemotes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx(t), "junk", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx(t), "other", []byte(`{"upstream":"web","tools":[]}`)); err != nil {
		t.Fatal(err)
	}
	w := watchRemotes(t, r)
	if _, err := r.Put(ctx(t), remoteRecord("ok", "t")); err != nil {
		t.Fatal(err)
	}
	if e := w.next(t); e.Upstream != "ok" || e.Remote == nil {
		t.Fatalf("event %+v: the initial foreign records must not be reported", e)
	}
	if _, err := kv.Put(ctx(t), "ok", []byte(`{"upstream":"ok"`)); err != nil {
		t.Fatal(err)
	}
	if e := w.next(t); e.Upstream != "ok" || e.Remote != nil || !e.Invalid {
		t.Fatalf("event %+v, want a garbled record reported as gone, and invalid", e)
	}
}

func TestOpenRemotesRefusesSubSecondTTL(t *testing.T) {
	_, nc := startBus(t)
	if _, err := bus.OpenRemotes(ctx(t), nc, bus.RemotesOptions{TTL: 500 * time.Millisecond}); err == nil {
		t.Error("a 500ms TTL was accepted")
	}
}

// TestRemotesNewerReplicaKeeps: of two replicas that list an upstream
// differently, the one started last keeps the record: the other's Put
// writes nothing until that record is gone. Records that list it alike
// replace each other whoever wrote them, and one written by another
// process (no writer) is anyone's.
func TestRemotesNewerReplicaKeeps(t *testing.T) {
	_, nc := startBus(t)
	r := openRemotes(t, nc, bus.RemotesOptions{})
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	record := func(writer string, at time.Duration, tools ...string) *bus.Remote {
		rec := remoteRecord("up", tools...)
		rec.Writer, rec.WriterStarted = writer, started.Add(at)
		if err := rec.Seal(); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	put := func(rec *bus.Remote) uint64 {
		t.Helper()
		rev, err := r.Put(ctx(t), rec)
		if err != nil {
			t.Fatalf("put by %q: %v", rec.Writer, err)
		}
		return rev
	}
	older := record("older", 0, "echo")
	newer := record("newer", time.Second, "echo", "count")
	put(record("", 0, "other"))
	put(older)
	rev := put(newer)
	if _, err := r.Put(ctx(t), older); !errors.Is(err, bus.ErrNewerReplica) {
		t.Fatalf("the older replica's put over the newer's record: %v, want ErrNewerReplica", err)
	}
	if next := put(newer); next != rev+1 {
		t.Errorf("the newer replica's next revision is %d after %d: the older one wrote", next, rev)
	}
	// Alike: the older replica refreshes the newer's listing, which still
	// names the newer replica: one started between the two that lists the
	// upstream otherwise leaves it alone.
	put(record("older", 0, "echo", "count"))
	if _, err := r.Put(ctx(t), record("middle", time.Second/2, "echo")); !errors.Is(err, bus.ErrNewerReplica) {
		t.Errorf("a put by a replica started between two that list alike: %v, want ErrNewerReplica", err)
	}
	if _, err := r.Put(ctx(t), record("", 0, "other")); !errors.Is(err, bus.ErrNewerReplica) {
		t.Errorf("a writer-less put over a replica's record: %v, want ErrNewerReplica", err)
	}
	// Gone: the older replica writes again.
	if err := r.Release(ctx(t), "up", put(newer)); err != nil {
		t.Fatal(err)
	}
	put(older)
	// A tie of start times is broken by the writers' names.
	if _, err := r.Put(ctx(t), record("alder", 0, "x")); !errors.Is(err, bus.ErrNewerReplica) {
		t.Errorf("a put by %q over %q's record, started together: %v, want ErrNewerReplica", "alder", "older", err)
	}
}

// TestRemotesNewerReplicaExpires: a newer replica's record that is no
// longer refreshed expires by its lease, and the older replica's Put then
// writes.
func TestRemotesNewerReplicaExpires(t *testing.T) {
	_, nc := startBus(t)
	r := openRemotes(t, nc, bus.RemotesOptions{TTL: time.Second})
	w := watchRemotes(t, r)
	older, newer := remoteRecord("up", "echo"), remoteRecord("up", "echo", "count")
	older.Writer, newer.Writer = "older", "newer"
	older.WriterStarted = time.Now()
	newer.WriterStarted = older.WriterStarted.Add(time.Second)
	for _, rec := range []*bus.Remote{older, newer} {
		if err := rec.Seal(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Put(ctx(t), newer); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Put(ctx(t), older); !errors.Is(err, bus.ErrNewerReplica) {
		t.Fatalf("put over the newer's record: %v, want ErrNewerReplica", err)
	}
	if e := w.next(t); e.Remote == nil || e.Remote.Writer != "newer" {
		t.Fatalf("event %+v, want the newer replica's record", e)
	}
	if e := w.next(t); e.Remote != nil {
		t.Fatalf("event %+v, want the record expired", e)
	}
	if _, err := r.Put(ctx(t), older); err != nil {
		t.Errorf("put once the newer record expired: %v", err)
	}
}
