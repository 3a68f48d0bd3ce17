package bus_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

func auditEvent() bus.AuditEvent {
	return bus.AuditEvent{
		Time:      time.Date(2026, 4, 21, 12, 0, 0, 0, time.UTC),
		Actor:     "gateway",
		Tenant:    "acme",
		Subject:   "agent-1",
		JTI:       "01hzxc0000000000000000jt10",
		Tool:      "sysecho." + node + ".echo.invoke",
		NodeID:    node,
		Decision:  bus.DecisionDenied,
		Code:      schemas.CodeSafetyDenied,
		Duration:  1500 * time.Microsecond,
		RequestID: "req-1",
	}
}

func TestAuditorLog(t *testing.T) {
	var buf bytes.Buffer
	a := &bus.Auditor{Log: slog.New(slog.NewJSONHandler(&buf, nil))}
	a.Record(auditEvent())

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d log lines, want 1:\n%s", len(lines), buf.String())
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
		t.Fatalf("log line is not JSON: %v\n%s", err, lines[0])
	}
	want := map[string]any{
		"level":      "INFO",
		"msg":        "audit",
		"actor":      "gateway",
		"tenant":     "acme",
		"subject":    "agent-1",
		"jti":        "01hzxc0000000000000000jt10",
		"tool":       "sysecho." + node + ".echo.invoke",
		"node_id":    node,
		"decision":   "denied",
		"code":       "E_SAFETY_DENIED",
		"duration":   float64(1500 * time.Microsecond),
		"request_id": "req-1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("field %s = %#v, want %#v", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok && k != "time" {
			t.Errorf("unexpected field %s = %v", k, got[k])
		}
	}
}

func TestAuditorPublish(t *testing.T) {
	srv, pub := startBus(t)
	sub := connect(t, srv, "audit-reader")
	s, err := sub.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	a := &bus.Auditor{Log: slog.New(slog.NewJSONHandler(&buf, nil)), NC: pub}

	// Events whose tenant cannot be a subject token are logged, not published.
	for _, tenant := range []string{"", "a.b", "*", ">", "a b"} {
		e := auditEvent()
		e.Tenant = tenant
		a.Record(e)
	}
	e := auditEvent()
	e.Time = time.Time{} // filled in by Record
	before := time.Now()
	a.Record(e)

	// Messages from one connection arrive in order: the first one seen must
	// be the valid event.
	m, err := s.NextMsg(eventTimeout)
	if err != nil {
		t.Fatalf("no audit message: %v", err)
	}
	if m.Subject != bus.Audit("acme") {
		t.Fatalf("published on %s, want %s", m.Subject, bus.Audit("acme"))
	}
	var got bus.AuditEvent
	if err := json.Unmarshal(m.Data, &got); err != nil {
		t.Fatal(err)
	}
	if got.Time.Before(before.Add(-time.Second)) || got.Time.After(time.Now().Add(time.Second)) {
		t.Errorf("time %v not filled in with now", got.Time)
	}
	want := auditEvent()
	got.Time = want.Time
	if got != want {
		t.Errorf("published\n got %+v\nwant %+v", got, want)
	}
	var raw map[string]any
	_ = json.Unmarshal(m.Data, &raw)
	for _, k := range []string{"arguments", "result", "message"} {
		if _, ok := raw[k]; ok {
			t.Errorf("audit message carries %q", k)
		}
	}
	if n := strings.Count(buf.String(), "\n"); n != 6 {
		t.Errorf("%d log lines, want 6 (every event is logged)", n)
	}
}

// The zero Auditor and a nil *Auditor discard events.
func TestAuditorZero(t *testing.T) {
	var nilAuditor *bus.Auditor
	nilAuditor.Record(auditEvent())
	(&bus.Auditor{}).Record(auditEvent())
}

// A started Auditor writes on its own goroutine, in the order events were
// recorded, loses none (more than its queue holds, from several
// goroutines), and writes the events recorded after Close itself.
func TestAuditorStarted(t *testing.T) {
	srv, pub := startBus(t)
	sub := connect(t, srv, "audit-reader")
	s, err := sub.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	a := &bus.Auditor{Log: slog.New(slog.NewJSONHandler(&buf, nil)), NC: pub}
	a.Start()
	a.Start() // a second Start changes nothing

	const writers, each = 4, 3000 // 12,000 events: three times the queue
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				e := auditEvent()
				e.RequestID = fmt.Sprintf("w%d-%d", w, i)
				a.Record(e)
			}
		})
	}
	wg.Wait()
	a.Close()
	after := auditEvent()
	after.RequestID = "after-close"
	a.Record(after) // written at once
	if !strings.Contains(buf.String(), `"request_id":"after-close"`) {
		t.Fatal("an event recorded after Close was not written by Record")
	}

	next := make([]int, writers) // per writer, the next index expected
	for n := 0; n < writers*each; n++ {
		m, err := s.NextMsg(eventTimeout)
		if err != nil {
			t.Fatalf("%d of %d events published: %v", n, writers*each, err)
		}
		var e bus.AuditEvent
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatal(err)
		}
		var w, i int
		if _, err := fmt.Sscanf(e.RequestID, "w%d-%d", &w, &i); err != nil {
			t.Fatalf("unexpected event %q", e.RequestID)
		}
		if i != next[w] {
			t.Fatalf("writer %d: event %d published after %d", w, i, next[w]-1)
		}
		next[w]++
	}
	if n := strings.Count(buf.String(), "\n"); n != writers*each+1 {
		t.Errorf("%d log lines, want %d", n, writers*each+1)
	}
}

// syncBuffer is a bytes.Buffer safe for the Auditor's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}

// An Auditor without a Log still publishes; Observe sees every event, in
// order, before it is published.
func TestAuditorObserve(t *testing.T) {
	srv, pub := startBus(t)
	sub := connect(t, srv, "audit-reader")
	s, err := sub.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		observed []string
	)
	a := &bus.Auditor{NC: pub, Observe: func(e bus.AuditEvent) {
		mu.Lock()
		defer mu.Unlock()
		observed = append(observed, e.RequestID)
	}}
	a.Start()
	defer a.Close()
	const n = 100
	for i := range n {
		e := auditEvent()
		e.RequestID = fmt.Sprint(i)
		a.Record(e)
	}
	for i := range n {
		m, err := s.NextMsg(eventTimeout)
		if err != nil {
			t.Fatalf("%d of %d events published: %v", i, n, err)
		}
		var e bus.AuditEvent
		if err := json.Unmarshal(m.Data, &e); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		seen := len(observed) > i && observed[i] == e.RequestID
		mu.Unlock()
		if !seen {
			t.Fatalf("event %s published before it was observed (observed %d)", e.RequestID, len(observed))
		}
	}
}

// countAudit counts the events published on okso.v1.audit.> until the
// test ends; wait returns once n have come.
type auditCount struct {
	mu   sync.Mutex
	n    int
	more chan struct{} // signalled at each message
}

func countAudit(t *testing.T, nc *nats.Conn) *auditCount {
	t.Helper()
	c := &auditCount{more: make(chan struct{}, 1)}
	sub, err := nc.Subscribe("okso.v1.audit.>", func(*nats.Msg) {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
		select {
		case c.more <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *auditCount) wait(t *testing.T, n int) {
	t.Helper()
	timeout := time.NewTimer(eventTimeout)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		got := c.n
		c.mu.Unlock()
		if got >= n {
			if got > n {
				t.Fatalf("%d events published, want %d", got, n)
			}
			return
		}
		select {
		case <-c.more:
		case <-timeout.C:
			t.Fatalf("%d of %d events published", got, n)
		}
	}
}

// auditLines decodes the log's lines.
func auditLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for l := range strings.Lines(log) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v\n%s", err, l)
		}
		lines = append(lines, m)
	}
	return lines
}

// TestAuditorLogRepeats: a flood of 100,000 events of one kind (a device
// sending bogus acks), with a few of two other kinds among them, leaves a
// few lines in the log: the first of each kind, then at the period's end
// one line per kind with how many more there were. Every event is
// published all the same. Then a period of 1,000 kinds (a caller naming
// node ids of its choosing) logs no more than maxAuditKinds of them apart.
func TestAuditorLogRepeats(t *testing.T) {
	srv, pub := startBus(t)
	count := countAudit(t, connect(t, srv, "audit-reader"))
	var buf syncBuffer
	tick := make(chan time.Time)
	a := &bus.Auditor{Log: slog.New(slog.NewJSONHandler(&buf, nil)), NC: pub,
		LogRepeats: 10 * time.Second, LogTick: tick}
	a.Start()
	defer a.Close()
	start := time.Now()
	tick <- start // the first period begins

	const flood = 100_000
	late := bus.AuditEvent{Actor: "tier", Tenant: "acme", Subject: node, NodeID: node, Decision: bus.DecisionLateAck}
	denied := auditEvent()
	other := auditEvent()
	other.NodeID = "01hzx9k3m4p7q8r9s0t1v2w3xz"
	for i := range flood {
		e := late
		e.RequestID = fmt.Sprint(i)
		a.Record(e)
		if i%1000 == 0 {
			a.Record(denied)
			a.Record(other)
		}
	}
	const total = flood + 2*flood/1000
	count.wait(t, total) // every event published: each was written
	tick <- start.Add(10 * time.Second)
	// Events are written in order: once this one is out, so are the lines
	// of the period before it.
	a.Record(late)
	count.wait(t, total+1)

	log := buf.String()
	t.Logf("%d events, %d bytes of log in %d lines", total+1, len(log), strings.Count(log, "\n"))
	if len(log) > 4<<10 {
		t.Errorf("%d bytes of log for %d events, want at most 4 KiB", len(log), total+1)
	}
	lines := auditLines(t, log)
	more := map[string]float64{} // by node and decision
	firsts := 0
	for _, l := range lines {
		switch l["msg"] {
		case "audit":
			firsts++
		case "audit repeated":
			more[l["node_id"].(string)+" "+l["decision"].(string)] = l["more"].(float64)
			if l["in_last"] != "10s" {
				t.Errorf("in_last = %v, want 10s", l["in_last"])
			}
		default:
			t.Errorf("unexpected line %v", l)
		}
	}
	want := map[string]float64{
		node + " " + bus.DecisionLateAck:                   flood - 1,
		node + " " + bus.DecisionDenied:                    flood/1000 - 1,
		"01hzx9k3m4p7q8r9s0t1v2w3xz " + bus.DecisionDenied: flood/1000 - 1,
	}
	if !maps.Equal(more, want) {
		t.Errorf("repeated lines %v, want %v", more, want)
	}
	if firsts != 4 { // each kind's first, and the first of the new period
		t.Errorf("%d audit lines, want 4", firsts)
	}

	// A period of 1,000 kinds.
	tick <- start.Add(20 * time.Second)
	buf.reset()
	for i := range 1000 {
		e := late
		e.NodeID = fmt.Sprintf("01hzx9k3m4p7q8r9s0t1v2%04d", i)
		a.Record(e)
	}
	a.Close() // writes the period's repeats
	count.wait(t, total+1+1000)
	lines = auditLines(t, buf.String())
	n, repeated := 0, 0.0
	for _, l := range lines {
		if l["msg"] == "audit" {
			n++
		} else {
			repeated += l["more"].(float64)
		}
	}
	if n != 65 || repeated != 1000-65 {
		t.Errorf("1,000 kinds: %d audit lines and %v counted, want 65 (64 kinds and one for all others) and 935", n, repeated)
	}
}

// TestAuditorPublishFailure: an event the Auditor cannot publish (its
// connection is closed) is a warning on its ErrorLog, naming the event
// but nothing a caller wrote; without an ErrorLog it is dropped quietly,
// as it always was.
func TestAuditorPublishFailure(t *testing.T) {
	srv, _ := startBus(t)
	nc := connect(t, srv, "auditor")
	nc.Close()
	var buf bytes.Buffer
	a := &bus.Auditor{NC: nc, ErrorLog: slog.New(slog.NewJSONHandler(&buf, nil))}
	a.Record(auditEvent())
	lines := auditLines(t, buf.String())
	if len(lines) != 1 {
		t.Fatalf("%d lines for one failed publish, want 1:\n%s", len(lines), buf.String())
	}
	l := lines[0]
	if l["level"] != "WARN" || l["msg"] != "audit publish" || l["tenant"] != "acme" || l["decision"] != bus.DecisionDenied ||
		!strings.Contains(fmt.Sprint(l["err"]), "closed") {
		t.Errorf("line %v, want a warning audit publish naming the tenant, the decision and the error", l)
	}
	if strings.Contains(buf.String(), auditEvent().Tool) {
		t.Errorf("the warning names the tool: %s", buf.String())
	}
	(&bus.Auditor{NC: nc}).Record(auditEvent())
}
