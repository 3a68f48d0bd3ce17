package bus_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/bus"
)

// TestStartServerSaysWhy: an embedded server whose client or route
// address is taken fails to start at once, with nats-server's reason,
// rather than wait out its 10 s to be ready.
func TestStartServerSaysWhy(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, tc := range []struct {
		name string
		o    bus.ServerOptions
	}{
		{"client address taken", bus.ServerOptions{Listen: addr}},
		{"route address taken", bus.ServerOptions{Listen: "127.0.0.1:0",
			Cluster: bus.ClusterOptions{Listen: addr, Routes: []string{"nats-route://127.0.0.1:1"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			srv, err := bus.StartServer(tc.o)
			if err == nil {
				srv.Shutdown()
				t.Fatal("started on a taken address")
			}
			if !strings.Contains(err.Error(), "address already in use") {
				t.Errorf("error %q does not say the address is in use", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("failed after %v, want at once", took)
			}
		})
	}
}
