package mcp

import (
	"runtime"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// mockRecords returns n records of nodes announcing what a mock device
// announces (echo, metrics, a GPIO pin: five tools), each with its own
// capabilities, as the registry's decoder gives the gateway.
func mockRecords(n int) []*bus.Node {
	recs := make([]*bus.Node, n)
	for i := range recs {
		id := strings.ToLower(ulid.Make().String())
		recs[i] = &bus.Node{NodeID: id, Tenant: "demo", SessionID: "s" + id, Tier: "tier",
			Agent: schemas.Agent{Name: "okso-mock", Version: "1.0.0"},
			Capabilities: []schemas.Capability{
				{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput, Verbs: []string{"invoke"},
					SafetyClass: schemas.SafetyReadOnly},
				{CapID: "metrics", Kind: schemas.KindMetrics, SchemaRef: schemas.MetricsSubInput,
					Verbs: []string{"snapshot", "subscribe"}, SafetyClass: schemas.SafetyReadOnly},
				{CapID: "pin", Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput, Verbs: []string{"read", "write"},
					SafetyClass: schemas.SafetyMutating},
			}}
	}
	return recs
}

// BenchmarkCatalogPerNode reports what the device source and the catalog
// hold per listed node (B/node: the live heap's growth over 2,000 mock
// nodes listed, the records themselves excluded), so that the gateway's
// memory per node can be followed without a fleet.
func BenchmarkCatalogPerNode(b *testing.B) {
	const n = 2000
	var perNode float64
	for b.Loop() {
		b.StopTimer()
		d := listingDevices(b)
		recs := mockRecords(n)
		d.pending[recs[0].NodeID] = recs[0].SessionID
		d.list(recs[0]) // the verbs' templates and documents, shared by every node
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.StartTimer()
		for _, rec := range recs[1:] {
			d.pending[rec.NodeID] = rec.SessionID
			d.list(rec)
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := len(d.ids()); got != n {
			b.Fatalf("%d nodes listed, want %d", got, n)
		}
		perNode = float64(after.HeapAlloc-before.HeapAlloc) / (n - 1)
		runtime.KeepAlive(d)
		runtime.KeepAlive(recs)
		b.StartTimer()
	}
	b.ReportMetric(perNode, "B/node")
}
