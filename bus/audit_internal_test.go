package bus

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/okso-io/okso/schemas"
)

// FuzzAuditEncode: an event encoded by hand is byte for byte what
// json.Marshal writes.
func FuzzAuditEncode(f *testing.F) {
	f.Add(int64(1795316088218123456), 0, "gateway", "demo", "agent", "01m80hetn3a3x84z368v26yy0p",
		"sysecho.01m80hetn3a3x84z368v26yy0p.echo.invoke", "", DecisionAllowed, "", int64(123456), "01M80HFSRTP6P5RGFY7RW4197Q")
	f.Add(int64(0), 3600, "tier", "", "", "", "", "", DecisionDenied, schemas.CodeSafetyDenied, int64(-1), "")
	f.Add(int64(0), 0, "remote", "demo", "agent", "", "everything.echo", "everything", DecisionAllowed, "", int64(5), "")
	f.Add(int64(-62135596800000000000/100), -37, "a<b", "é", "\"", "\\", "&", "é", "", "\x00", int64(0), "\u2028")
	f.Add(int64(253402300800000000), 0, "x", "", "", "", "", "", "", "", int64(0), "")
	f.Fuzz(func(t *testing.T, unixNano int64, offset int, actor, tenant, subject, jti, tool, upstream, decision, code string, dur int64, reqID string) {
		e := AuditEvent{
			Time:  time.Unix(0, unixNano).In(time.FixedZone("z", offset%(24*3600))),
			Actor: actor, Tenant: tenant, Subject: subject, JTI: jti, Tool: tool, Upstream: upstream,
			Decision: decision, Code: code, Duration: time.Duration(dur), RequestID: reqID, Parent: jti, QueryHash: reqID,
		}
		want, wantErr := json.Marshal(e)
		got, err := e.encode()
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("encode %s (%v)\njson.Marshal %s (%v)", got, err, want, wantErr)
		}
		// Appended to a reused buffer (the Auditor's goroutine's), the same.
		scratch := append(make([]byte, 0, 8), "stale"...)
		if got, err := e.appendJSON(scratch[:0]); (err == nil) != (wantErr == nil) || err == nil && !bytes.Equal(got, want) {
			t.Fatalf("appendJSON %s (%v)\njson.Marshal %s (%v)", got, err, want, wantErr)
		}
	})
}

// gatedWriter holds its first write until release is closed; later writes
// go through at once. It keeps the lines in the order written.
type gatedWriter struct {
	release chan struct{}
	mu      sync.Mutex
	first   bool
	lines   []string
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	first := !g.first
	g.first = true
	g.mu.Unlock()
	if first {
		<-g.release
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lines = append(g.lines, string(p))
	return len(p), nil
}

// TestAuditorCloseKeepsOrder: an event recorded while Close writes the
// queue comes out after the queued ones.
func TestAuditorCloseKeepsOrder(t *testing.T) {
	w := &gatedWriter{release: make(chan struct{})}
	a := &Auditor{Log: slog.New(slog.NewJSONHandler(w, nil))}
	a.Start()
	for i := range 100 {
		a.Record(AuditEvent{Actor: "gateway", Decision: DecisionAllowed, RequestID: fmt.Sprintf("e%d", i)})
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	// Wait until Close has begun: it holds the lock, or (as it once did)
	// has let go of the queue.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !a.mu.TryRLock() {
			break
		}
		begun := a.q == nil
		a.mu.RUnlock()
		if begun {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close never began")
		}
		runtime.Gosched()
	}
	late := make(chan struct{})
	go func() {
		a.Record(AuditEvent{Actor: "gateway", Decision: DecisionAllowed, RequestID: "late"})
		close(late)
	}()
	select {
	case <-late: // written ahead of the queue: the order is lost
	case <-time.After(200 * time.Millisecond): // waits for Close, as it should
	}
	close(w.release)
	<-closed
	<-late
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.lines) != 101 || !strings.Contains(w.lines[100], `"request_id":"late"`) {
		for i, l := range w.lines {
			if strings.Contains(l, `"late"`) {
				t.Fatalf("the event recorded during Close was written %dth of %d", i+1, len(w.lines))
			}
		}
		t.Fatalf("%d lines, and none is the late event", len(w.lines))
	}
}
