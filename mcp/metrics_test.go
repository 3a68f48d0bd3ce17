package mcp

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/okso-io/okso/schemas"
)

// TestCallMetrics: calls count by template, source and outcome; a
// thousand nodes' tools are one template's series; okso's fleet tools
// count as fleet; an unknown tool as none.
func TestCallMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := newCallMetrics(reg)
	device := &origin{source: sourceNameDevice}
	for i := range 1000 {
		const digits = "0123456789abcdefghjkmnpqrstvwxyz" // a node id's alphabet
		node := schemas.ToolName{KindShort: "sysecho", NodeID: "01hzx9k3m4p7q8r9s0t1v2w3" + digits[i%32:i%32+1] + digits[i/32:i/32+1],
			CapID: "echo", Verb: "invoke"}.String()
		code := ""
		if i%10 == 0 {
			code = schemas.CodeDeadlineExceeded
		}
		m.observe(&entry{name: node, origin: device}, code, time.Millisecond)
	}
	m.observe(&entry{name: "fleet.call", origin: oksoOrigin}, "", time.Second)
	m.observe(&entry{name: "everything.echo", origin: &origin{source: sourceNameUpstream, upstream: "everything"}}, "", time.Second)
	m.observe(nil, schemas.CodeToolNotFound, time.Millisecond)

	for _, c := range []struct {
		source, code string
		want         float64
	}{
		{"device", "ok", 900}, {"device", schemas.CodeDeadlineExceeded, 100}, {"fleet", "ok", 1}, {"upstream", "ok", 1},
		{"none", schemas.CodeToolNotFound, 1},
	} {
		if got := testutil.ToFloat64(m.calls.WithLabelValues(c.source, c.code)); got != c.want {
			t.Errorf("calls{source=%s,code=%s} = %v, want %v", c.source, c.code, got, c.want)
		}
	}
	// A series per template and outcome seen: 2 of the device template,
	// one each of fleet.call, everything.* and the unknown tool.
	if n := testutil.CollectAndCount(m.duration); n != 5 {
		t.Errorf("%d duration series, want 5", n)
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("gather: %v", err)
	}
}

// BenchmarkCallMetrics: what the metrics add to a call.
func BenchmarkCallMetrics(b *testing.B) {
	m := newCallMetrics(prometheus.NewRegistry())
	e := &entry{name: "sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke", origin: &origin{source: sourceNameDevice}}
	m.observe(e, "", time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		m.observe(e, "", time.Millisecond)
	}
}
