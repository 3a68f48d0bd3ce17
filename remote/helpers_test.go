package remote_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
)

// waitLong bounds the wait for an event that must come, on a shared and
// loaded 2-core machine.
const waitLong = 10 * time.Second

// testLog is a logger that writes through t.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLong):
		t.Fatalf("%s: not within %v", what, waitLong)
	}
}

// eventually waits for cond, checking it every few milliseconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitLong)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, waitLong)
		}
	}
}

func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), waitLong)
	t.Cleanup(cancel)
	return ctx
}

// dialStdio starts the test upstream as a stdio child counting in a
// directory of its own, and closes it when the test ends.
func dialStdio(t *testing.T, o testupstream.Options) (remote.Client, string) {
	t.Helper()
	if o.State == "" {
		o.State = t.TempDir()
	}
	argv, env := testupstream.Command(o)
	c, err := remote.DialStdio(bounded(t), remote.StdioOptions{Command: argv, Env: env, Log: testLog(t)})
	if err != nil {
		t.Fatalf("DialStdio: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, o.State
}

// result is a CallToolResult as a Client returns it.
type result struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent json.RawMessage `json:"structuredContent"`
	IsError           bool            `json:"isError"`
	Meta              json.RawMessage `json:"_meta"`
}

func decodeResult(t *testing.T, raw json.RawMessage) result {
	t.Helper()
	var r result
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("result %s: %v", raw, err)
	}
	if r.Meta != nil {
		t.Errorf("result %s carries _meta", raw)
	}
	return r
}

// echoed is the structured content of the test upstream's echo.
type echoed struct {
	Message string            `json:"message"`
	Meta    map[string]any    `json:"meta"`
	Headers map[string]string `json:"headers"`
}

func wantCode(t *testing.T, err error, code string, transient bool) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %s", code)
	}
	got, tr := remote.Classify(err)
	if got != code || tr != transient {
		t.Errorf("Classify(%v) = %s, %v; want %s, %v", err, got, tr, code, transient)
	}
}

func toolNames(tools []remote.Tool) []string {
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	return names
}
