package tier_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// BenchmarkSessionMemory holds b.N idle devices on one tier and reports
// what each costs it in goroutine stacks once the collector has shrunk
// them: stack-B/conn and goroutines/conn. The devices, played by hand in
// this process, run no goroutine of their own while idle, so both figures
// are the tier's. (Heap is not reported: the devices' ends are in this
// process too. make scale measures a tier's whole memory.)
//
//	go test ./device/tier -run '^$' -bench SessionMemory -benchtime 2000x
func BenchmarkSessionMemory(b *testing.B) {
	tt := newTestTier(b, tier.Options{ConnRatePerIP: -1})
	before := settled()
	conns := make([]*websocket.Conn, 0, b.N)
	b.Cleanup(func() {
		for _, c := range conns {
			_ = c.CloseNow()
		}
	})
	for range b.N {
		conns = append(conns, connectIdle(b, tt))
	}
	after := settled()
	b.ReportMetric(float64(after.StackInuse-before.StackInuse)/float64(b.N), "stack-B/conn")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(b.N), "goroutines/conn")
}

type memState struct {
	runtime.MemStats
	goroutines int
}

// settled collects until stacks have shrunk as far as they will (each
// collection halves a stack at most), then reads the memory statistics.
func settled() memState {
	for range 6 {
		runtime.GC()
	}
	var m memState
	runtime.ReadMemStats(&m.MemStats)
	m.goroutines = runtime.NumGoroutine()
	return m
}

// connectIdle connects a device with the echo capability and leaves it
// idle: nothing reads its end.
func connectIdle(b *testing.B, tt *testTier) *websocket.Conn {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), tiertest.WaitFor)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, tt.URL, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		b.Fatalf("dial: %v", err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	node := wire.NewNodeID()
	expect := func(typ string) {
		_, frame, err := c.Read(ctx)
		if err != nil {
			b.Fatalf("read %s: %v", typ, err)
		}
		e, err := wire.DecodeEnvelope(tt.Schemas, frame)
		if err != nil || e.Type != typ {
			b.Fatalf("got %s (%v), want %s", frame, err, typ)
		}
	}
	send := func(typ string, payload any) {
		frame, err := wire.Encode(typ, "", payload)
		if err == nil {
			err = c.Write(ctx, websocket.MessageText, frame)
		}
		if err != nil {
			b.Fatalf("send %s: %v", typ, err)
		}
	}
	expect(wire.TypeHello)
	send(wire.TypeAuth, wire.Auth{Token: tt.Token(b, node)})
	expect(wire.TypeAuthOK)
	send(wire.TypeAnnounce, manifest(node, []schemas.Capability{echoCapability()}...))
	expect(wire.TypeAnnounceOK)
	return c
}
