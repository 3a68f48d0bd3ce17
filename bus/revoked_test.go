package bus_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
)

const (
	jtiA = "01hzxc0000000000000000jt1a"
	jtiB = "01hzxc0000000000000000jt1b"
	jtiC = "01hzxc0000000000000000jt1c"
)

// openRevocations opens the revocation set on nc and follows the bucket
// until the test ends; it returns once the present set is loaded.
func openRevocations(t *testing.T, nc *nats.Conn) *bus.Revocations {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	r, err := bus.OpenRevocations(ctx, nc, bus.RevocationOptions{})
	if err != nil {
		t.Fatalf("OpenRevocations: %v", err)
	}
	rctx, stop := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	first := true
	go func() {
		done <- r.Run(rctx, func() {
			if first {
				first = false
				close(ready)
			}
		}, nil)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("the revocations never loaded")
	}
	return r
}

// storage returns the storage type of the revocation bucket.
func storage(t *testing.T, nc *nats.Conn) jetstream.StorageType {
	t.Helper()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), bus.BucketRevoked)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.Config().Storage
}

// TestRevocationsSurviveRestart: a revocation is still there after the
// embedded server stops and starts again on the same store and name.
func TestRevocationsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() (*bus.Server, *nats.Conn) {
		srv, err := bus.StartServer(bus.ServerOptions{StoreDir: dir, Name: "n1"})
		if err != nil {
			t.Fatalf("StartServer: %v", err)
		}
		nc, err := srv.Connect("test")
		if err != nil {
			srv.Shutdown()
			t.Fatal(err)
		}
		return srv, nc
	}
	srv, nc := start()
	ctx, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()
	r, err := bus.OpenRevocations(ctx, nc, bus.RevocationOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(ctx, jtiA, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if s := storage(t, nc); s != jetstream.FileStorage {
		t.Errorf("bucket in %v storage, want file", s)
	}
	nc.Close()
	srv.Shutdown()

	srv, nc = start()
	t.Cleanup(srv.Shutdown)
	t.Cleanup(nc.Close)
	r = openRevocations(t, nc)
	if !r.Revoked(jtiA) {
		t.Error("the revocation was lost in the restart")
	}
	if r.Revoked(jtiB) {
		t.Error("a token never revoked is revoked")
	}
}

// TestRevocationsMovedToFile: a bucket an older okso made in memory
// storage is moved to file storage with its revocations and their expiry.
func TestRevocationsMovedToFile(t *testing.T) {
	srv, nc := startBus(t)
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bus.BucketRevoked, History: 1,
		Storage: jetstream.MemoryStorage, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).Truncate(time.Second)
	for _, jti := range []string{jtiA, jtiB} {
		if _, err := js.Publish(ctx, "$KV."+bus.BucketRevoked+"."+jti,
			[]byte(strconv.FormatInt(until.Unix(), 10)), jetstream.WithMsgTTL(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// An older okso follows the memory bucket meanwhile.
	older := openRevocations(t, connect(t, srv, "older"))
	r := openRevocations(t, nc)
	if s := storage(t, nc); s != jetstream.FileStorage {
		t.Fatalf("bucket in %v storage after OpenRevocations, want file", s)
	}
	for _, jti := range []string{jtiA, jtiB} {
		if !r.Revoked(jti) {
			t.Errorf("%s lost in the move", jti)
		}
	}
	kv, _ := js.KeyValue(ctx, bus.BucketRevoked)
	e, err := kv.Get(ctx, jtiA)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(e.Value()); got != strconv.FormatInt(until.Unix(), 10) {
		t.Errorf("moved revocation lasts until %s, want %d", got, until.Unix())
	}
	// A second process binds to the file bucket as it is.
	openRevocations(t, nc)
	// The older process still sees what is revoked, and follows the new
	// bucket.
	if !older.Revoked(jtiA) {
		t.Error("the older process forgot a revocation in the move")
	}
	if err := r.Revoke(ctx, jtiC, until); err != nil {
		t.Fatal(err)
	}
	wait := time.NewTimer(eventTimeout)
	defer wait.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !older.Revoked(jtiC) {
		select {
		case <-wait.C:
			t.Fatal("the older process never saw a revocation made after the move")
		case <-tick.C:
		}
	}
}

// TestStoreLocked: two servers never share a JetStream store.
func TestStoreLocked(t *testing.T) {
	dir := t.TempDir()
	srv, err := bus.StartServer(bus.ServerOptions{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	_, err = bus.StartServer(bus.ServerOptions{StoreDir: dir})
	if err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Errorf("a second server on the same store: %v, want in use", err)
	}
	srv.Shutdown()
	srv, err = bus.StartServer(bus.ServerOptions{StoreDir: dir})
	if err != nil {
		t.Fatalf("the store once free: %v", err)
	}
	srv.Shutdown()
}

// TestRevocationsSurviveClusterRestart: in a cluster of three embedded
// servers, the bucket is on three replicas, and a revocation outlives a
// restart of every server (each on its own store, under its own name).
func TestRevocationsSurviveClusterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a JetStream cluster twice")
	}
	dir := t.TempDir()
	// Every member routes to the others (JetStream wants routes at start),
	// on the same ports after the restart.
	var routes []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, ln.Addr().String())
		ln.Close()
	}
	start := func() []*bus.Server {
		var srvs []*bus.Server
		for i, name := range []string{"n1", "n2", "n3"} {
			o := bus.ServerOptions{Name: name, StoreDir: filepath.Join(dir, name), Listen: "127.0.0.1:0",
				Cluster: bus.ClusterOptions{Name: "okso", Listen: routes[i]}}
			for j, r := range routes {
				if j != i {
					o.Cluster.Routes = append(o.Cluster.Routes, "nats-route://"+r)
				}
			}
			srv, err := bus.StartServer(o)
			if err != nil {
				t.Fatal(err)
			}
			srvs = append(srvs, srv)
		}
		return srvs
	}
	stop := func(srvs []*bus.Server) {
		for _, s := range srvs {
			s.Shutdown()
		}
	}
	// open retries while the cluster elects its JetStream leader.
	open := func(nc *nats.Conn) *bus.Revocations {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		for {
			octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
			r, err := bus.OpenRevocations(octx, nc, bus.RevocationOptions{Replicas: 3})
			ocancel()
			if err == nil {
				return r
			}
			select {
			case <-ctx.Done():
				t.Fatalf("OpenRevocations: %v", err)
			case <-time.After(100 * time.Millisecond): // the cluster has no leader yet
			}
		}
	}
	srvs := start()
	nc, err := srvs[1].Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	r := open(nc)
	if err := r.Revoke(t.Context(), jtiA, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	kv, _ := js.KeyValue(t.Context(), bus.BucketRevoked)
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Config(); c.Replicas != 3 || c.Storage != jetstream.FileStorage {
		t.Errorf("bucket on %d replicas in %v storage, want 3 in file", c.Replicas, c.Storage)
	}
	nc.Close()
	stop(srvs)

	srvs = start()
	defer stop(srvs)
	nc, err = srvs[2].Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	open(nc)
	if !openRevocations(t, nc).Revoked(jtiA) {
		t.Error("the revocation was lost when the cluster restarted")
	}
}

// lineSink is a log that hands each line to the test, and drops those
// the test does not take.
type lineSink chan string

func (s lineSink) Write(p []byte) (int, error) {
	select {
	case s <- string(p):
	default:
	}
	return len(p), nil
}

// TestRevocationsRunSaysWhyItFollowsAgain: a watch that ends (here with
// its connection) is a warning with its error, then the bucket is
// followed again; Run returns nil once its context ends.
func TestRevocationsRunSaysWhyItFollowsAgain(t *testing.T) {
	srv, _ := startBus(t)
	nc := connect(t, srv, "revocations")
	lines := make(lineSink, 64)
	r, err := bus.OpenRevocations(ctx(t), nc, bus.RevocationOptions{Log: slog.New(slog.NewJSONHandler(lines, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}, 1), make(chan error, 1)
	go func() {
		done <- r.Run(rctx, func() {
			select {
			case ready <- struct{}{}:
			default:
			}
		}, nil)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v once its context ended, want nil", err)
		}
	}()
	timeout := time.After(eventTimeout)
	select {
	case <-ready:
	case <-timeout:
		t.Fatal("the revocations never loaded")
	}
	nc.Close()
	for {
		select {
		case l := <-lines:
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil || m["level"] != "WARN" {
				continue
			}
			if m["bucket"] != bus.BucketRevoked || m["err"] == nil {
				t.Errorf("warning %v names no bucket or error", m)
			}
			return
		case <-timeout:
			t.Fatal("the end of the watch was not logged")
		}
	}
}
