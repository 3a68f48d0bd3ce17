package bus_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/okso-io/okso/bus"
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
		Code:      bus.CodeSafetyDenied,
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
