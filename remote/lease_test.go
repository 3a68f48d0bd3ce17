package remote_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
)

// TestTierLeaseNeedsLiveUpstream: an HTTP upstream that dies while
// nothing calls it (its connections cut, as when its process is killed)
// loses its record within the lease. The MCP client would only find out
// when its event stream fails to reopen, many seconds later; the lease
// is refreshed only while the upstream answers.
func TestTierLeaseNeedsLiveUpstream(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	t.Cleanup(u.EndSessions)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: u.Handler()}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", "http://"+ln.Addr().String(), []string{"echo"})}})
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}

	killed := time.Now()
	_ = srv.Close()                                  // the listener and every connection, the event stream's too
	within := b.remotes.TTL() + 500*time.Millisecond // the lease and a margin
	for b.next(t, "up") != nil {                     // a refresh
		if took := time.Since(killed); took > within {
			t.Fatalf("the record of a dead upstream is still refreshed %v after it died, want it gone within %v", took, within)
		}
	}
	if took := time.Since(killed); took > within {
		t.Errorf("the record of a dead upstream went %v after it died, want within %v", took, within)
	}
}

// TestTierKeepsStatelessUpstream: an upstream of the revision 2026-07-28,
// served statelessly by the official Go SDK, which has no ping for that
// revision and refuses the SDK client's, stays federated for three
// leases under calls: every call succeeds, its record is renewed, and it
// never lapses.
func TestTierKeepsStatelessUpstream(t *testing.T) {
	b := startTierBus(t)
	srv := httptest.NewServer(testupstream.New(testupstream.Options{}).StatelessHandler())
	t.Cleanup(srv.Close)
	refusesPing(t, srv.URL)
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"count"})}})
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}

	window := 3 * b.remotes.TTL()
	const callers, most = 2, 60 // each caller's calls: one every window/most at most
	var ok atomic.Int64
	failed := make(chan string, callers*most)
	stop := make(chan struct{})
	var calls sync.WaitGroup
	for range callers {
		calls.Go(func() {
			pace := time.NewTicker(window / most)
			defer pace.Stop()
			for range most {
				select {
				case <-stop:
					return
				case <-pace.C:
				}
				rep, err := request(b.nc, "up", "count", `{}`, time.Second)
				switch {
				case err != nil:
					failed <- err.Error()
				case !rep.OK:
					failed <- code(rep)
				default:
					ok.Add(1)
				}
			}
		})
	}
	end := time.NewTimer(window)
	defer end.Stop()
	renewals := 0
watch:
	for {
		select {
		case e := <-b.records:
			if e.Upstream != "up" {
				continue
			}
			if e.Remote == nil {
				t.Fatalf("the record lapsed after %d renewals", renewals)
			}
			renewals++
		case <-end.C:
			break watch
		}
	}
	close(stop)
	calls.Wait()
	close(failed)
	for f := range failed {
		t.Errorf("a call failed: %s", f)
	}
	t.Logf("%d calls succeeded, the record renewed %d times in %v", ok.Load(), renewals, window)
	if renewals == 0 || ok.Load() == 0 {
		t.Errorf("%d renewals and %d calls in %v, want some of each", renewals, ok.Load(), window)
	}
}

// refusesPing fails the test unless the upstream at url speaks the
// revision 2026-07-28 to the SDK's client and refuses its ping, as the
// upstreams the tier must keep do.
func refusesPing(t *testing.T, url string) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "okso-test", Version: "1"}, nil)
	cs, err := c.Connect(bounded(t), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Fatalf("the upstream speaks %s, want 2026-07-28", v)
	}
	if err := cs.Ping(bounded(t), nil); err == nil {
		t.Fatal("the upstream answers the SDK's ping: this test would prove nothing")
	}
}

// Messages of the tier about an upstream's lease.
const (
	lapseMsg   = "upstream's lease is not renewed: unless another replica renews it, its tools leave every list when it lapses"
	renewMsg   = "upstream's lease is renewed again"
	removedMsg = "upstream's record removed: its tools leave every list until it is listed again"
)

// TestTierLeaseLostAndBack: an upstream that does not answer pings (a
// proxy's 502 page, or silence) loses its lease even while it lists: its
// record lapses, and the tier says so at warn with the upstream and the
// reason, once however many periods it stays so; when it answers again
// its record is back, said once at info. One behind a proxy that answers
// 502 to everything loses its lease as well, then its record, said at
// warn with the reason.
func TestTierLeaseLostAndBack(t *testing.T) {
	for _, tc := range []struct {
		answer string
		every  bool // every POST, not only pings
		reason string
	}{
		{"a proxy's 502 page", false, "HTTP 502"},
		{"silence", false, "deadline exceeded"},
		{"a proxy's 502 page", true, "HTTP 502"},
	} {
		name := tc.answer + " to pings"
		if tc.every {
			name = tc.answer + " to everything"
		}
		t.Run(name, func(t *testing.T) {
			b := startTierBus(t)
			g := newPingGate(t, testupstream.New(testupstream.Options{}).Handler())
			g.every = tc.every
			srv := httptest.NewServer(g)
			t.Cleanup(srv.Close)
			log := &logged{changed: make(chan struct{})}
			runBuilt(t, newTier(t, b.nc, b.remotes,
				&remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"count"})}}, log.logger(t)))
			t.Cleanup(func() { close(g.release) }) // before the tier stops
			if b.next(t, "up") == nil {
				t.Fatal("no record")
			}

			g.answer.Store(tc.answer)
			for b.next(t, "up") != nil { // renewals, until it lapses
			}
			lost := log.wait(t, lapseMsg, 1)[0]
			if lost.level != slog.LevelWarn || lost.attrs["upstream"] != "up" || !strings.Contains(lost.attrs["err"], tc.reason) {
				t.Errorf("the lease lost was logged %v %v, want at warn with upstream up and a reason with %q", lost.level, lost.attrs, tc.reason)
			}
			if !tc.every {
				g.pings(t, 3) // three more periods
				if n := log.count(lapseMsg); n != 1 {
					t.Errorf("the lease lost was logged %d times, want once", n)
				}
			} else {
				// It cannot be listed either: the tier gives it up.
				removed := log.wait(t, removedMsg, 1)[0]
				if removed.level != slog.LevelWarn || removed.attrs["upstream"] != "up" || !strings.Contains(removed.attrs["err"], tc.reason) {
					t.Errorf("the record removed was logged %v %v, want at warn with upstream up and a reason with %q", removed.level, removed.attrs, tc.reason)
				}
			}

			g.answer.Store("")
			if b.next(t, "up") == nil {
				t.Fatal("the record went again")
			}
			if tc.every {
				return // listed again by a new session
			}
			back := log.wait(t, renewMsg, 1)[0]
			if back.level != slog.LevelInfo || back.attrs["upstream"] != "up" {
				t.Errorf("the lease back was logged %v %v, want at info with upstream up", back.level, back.attrs)
			}
			g.pings(t, 3)
			if n, m := log.count(lapseMsg), log.count(renewMsg); n != 1 || m != 1 {
				t.Errorf("the lease lost was logged %d times and back %d times, want once each", n, m)
			}
		})
	}
}

// logged keeps the records a logger wrote, with the attributes of its
// With. It is safe for concurrent use.
type logged struct {
	mu      sync.Mutex
	records []logRecord
	changed chan struct{} // closed and replaced on every record
}

type logRecord struct {
	msg   string
	level slog.Level
	attrs map[string]string
}

// logger writes through t and to l.
func (l *logged) logger(t *testing.T) *slog.Logger {
	return slog.New(&keepingHandler{inner: testLog(t).Handler(), l: l})
}

// wait waits for n records of msg, and returns them.
func (l *logged) wait(t *testing.T, msg string, n int) []logRecord {
	t.Helper()
	deadline := time.NewTimer(waitLong)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		var got []logRecord
		for _, r := range l.records {
			if r.msg == msg {
				got = append(got, r)
			}
		}
		changed := l.changed
		l.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%d records %q within %v, want %d", len(got), msg, waitLong, n)
		}
	}
}

func (l *logged) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.msg == msg {
			n++
		}
	}
	return n
}

type keepingHandler struct {
	inner slog.Handler
	l     *logged
	attrs []slog.Attr
}

func (h *keepingHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *keepingHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := logRecord{msg: r.Message, level: r.Level, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.l.mu.Lock()
	h.l.records = append(h.l.records, rec)
	close(h.l.changed)
	h.l.changed = make(chan struct{})
	h.l.mu.Unlock()
	return h.inner.Handle(ctx, r)
}

func (h *keepingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &keepingHandler{inner: h.inner.WithAttrs(as), l: h.l, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h *keepingHandler) WithGroup(name string) slog.Handler {
	return &keepingHandler{inner: h.inner.WithGroup(name), l: h.l, attrs: h.attrs}
}
