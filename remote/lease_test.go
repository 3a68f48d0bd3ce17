package remote_test

import (
	"net"
	"net/http"
	"testing"
	"time"

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
