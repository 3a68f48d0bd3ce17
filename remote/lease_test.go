package remote_test

import (
	"net"
	"net/http"
	"net/http/httptest"
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
