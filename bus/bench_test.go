package bus_test

import (
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
)

// BenchmarkNATSHop: one request/reply over an embedded server's in-process
// connections, the hop between gateway and tier.
func BenchmarkNATSHop(b *testing.B) {
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	tier, _ := srv.Connect("tier")
	defer tier.Close()
	gw, _ := srv.Connect("gateway")
	defer gw.Close()
	reply := bus.OKReply([]byte(`{"message":"ping"}`))
	sub, err := tier.Subscribe(bus.NodeCmd("01hzx9k3m4p7q8r9s0t1v2w3xy"), func(m *nats.Msg) { _ = m.Respond(reply) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = tier.Flush()
	body := []byte(`{"tool":"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke","arguments":{"message":"ping"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := gw.Request(bus.NodeCmd("01hzx9k3m4p7q8r9s0t1v2w3xy"), body, 5e9); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuditor: events recorded through a started Auditor that logs
// them as JSON and publishes them on an embedded server, one call's
// audit record each (same kind, a fresh request id); the figure is the
// Auditor's goroutine's cost per event once its queue is full.
func BenchmarkAuditor(b *testing.B) {
	for _, bc := range []struct {
		name    string
		repeats time.Duration
	}{{"every line", 0}, {"repeats", 10 * time.Second}} {
		b.Run(bc.name, func(b *testing.B) {
			srv, err := bus.StartServer(bus.ServerOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown()
			nc, _ := srv.Connect("audit")
			defer nc.Close()
			a := &bus.Auditor{Log: slog.New(slog.NewJSONHandler(io.Discard, nil)), NC: nc, LogRepeats: bc.repeats}
			a.Start()
			e := bus.AuditEvent{Actor: "gateway", Tenant: "demo", Subject: "agent", JTI: "01hzxc0000000000000000jt10",
				Tool: "sysecho." + node + ".echo.invoke", NodeID: node, Decision: bus.DecisionAllowed,
				Duration: 412 * time.Microsecond}
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = strconv.Itoa(1e6 + i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				e.RequestID = ids[i%len(ids)]
				a.Record(e)
				i++
			}
			a.Close()
		})
	}
}
