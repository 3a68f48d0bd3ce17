package bus_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
)

// BenchmarkParseToolName: the gateway parses every called name.
func BenchmarkParseToolName(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := bus.ParseToolName("sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke"); !ok {
			b.Fatal("not parsed")
		}
	}
}

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
