package roles

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/oklog/run"
)

// TestMockFleetSourceAddr: okso mock-fleet --source-addr dials from that
// address (what lets one host run more devices than one address has
// ports for), and refuses what is not an IP address.
func TestMockFleetSourceAddr(t *testing.T) {
	from := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		select {
		case from <- host:
		default:
		}
		http.Error(w, "not a tier", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/device/ws"

	log := slog.New(slog.DiscardHandler)
	dataDir := t.TempDir()
	if _, err := NewMockFleet(log, MockFleetConfig{Count: 1, Connect: []string{url}, DataDir: dataDir, Tenant: DefaultTenant, Source: "localhost"}); err == nil ||
		!strings.Contains(err.Error(), "--source-addr") {
		t.Errorf("--source-addr localhost: want an error naming the flag, got %v", err)
	}
	m, err := NewMockFleet(log, MockFleetConfig{Count: 2, Connect: []string{url}, DataDir: dataDir, Tenant: DefaultTenant, Source: "127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- runGroup(ctx, func(g *run.Group) { m.fleet.actors(g) }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mock-fleet stopped with %v", err)
		}
	}()
	for range 2 {
		select {
		case host := <-from:
			if host != "127.0.0.2" {
				t.Errorf("a device dialled from %s, want 127.0.0.2", host)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no device dialled within 10 s")
		}
	}
}
