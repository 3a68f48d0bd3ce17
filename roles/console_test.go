package roles

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// TestLogDefaults: on a terminal the log is text without audit lines,
// elsewhere JSON with them; a flag or an OKSO_* variable wins either way.
func TestLogDefaults(t *testing.T) {
	tests := []struct {
		name     string
		terminal bool
		args     []string
		env      map[string]string
		format   string
		audit    bool
	}{
		{name: "terminal", terminal: true, format: "text", audit: false},
		{name: "pipe", terminal: false, format: "json", audit: true},
		{name: "terminal, json asked", terminal: true, args: []string{"--log-format", "json"}, format: "json", audit: false},
		{name: "terminal, audit asked", terminal: true, args: []string{"--log-audit"}, format: "text", audit: true},
		{name: "pipe, no audit asked", terminal: false, args: []string{"--log-audit=false"}, format: "json", audit: false},
		{name: "pipe, text asked", terminal: false, args: []string{"--log-format=text"}, format: "text", audit: true},
		{name: "terminal, environment", terminal: true,
			env: map[string]string{"OKSO_LOG_FORMAT": "json", "OKSO_LOG_AUDIT": "true"}, format: "json", audit: true},
		{name: "pipe, environment", terminal: false,
			env: map[string]string{"OKSO_LOG_FORMAT": "text", "OKSO_LOG_AUDIT": "false"}, format: "text", audit: false},
		{name: "flag over environment", terminal: false, args: []string{"--log-audit"},
			env: map[string]string{"OKSO_LOG_AUDIT": "false"}, format: "json", audit: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var l logFlags
			fs := pflag.NewFlagSet("role", pflag.ContinueOnError)
			l.add(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := bindEnv(fs); err != nil {
				t.Fatal(err)
			}
			l.defaults(tc.terminal)
			if l.format != tc.format || l.audit != tc.audit {
				t.Errorf("format %q audit %v, want %q %v", l.format, l.audit, tc.format, tc.audit)
			}
		})
	}
}

// TestCallSummary: the line counts the calls, the allowed ones, the others
// by code (or decision), and the allowed ones' p50 and p99; the end of a
// stream is left out, and a period without calls writes nothing.
func TestCallSummary(t *testing.T) {
	logs := newLogSink()
	s := &callSummary{log: slog.New(slog.NewJSONHandler(logs, nil)), period: time.Minute}
	s.flush()
	if logs.String() != "" {
		t.Fatalf("a period without calls wrote %s", logs)
	}
	for i := 1; i <= 100; i++ {
		s.observe(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionAllowed, Duration: time.Duration(i) * time.Millisecond})
	}
	s.observe(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionNotFound, Code: schemas.CodeToolNotFound})
	s.observe(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionNotFound, Code: schemas.CodeToolNotFound})
	s.observe(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionDenied, Code: "invalid_token"})
	s.observe(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionTimeout})
	s.observe(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionStreamClosed, Code: "1000", Duration: time.Hour})
	s.flush()
	got := logs.wait(t, "calls line", line("calls"))
	b, _ := json.Marshal(got["failed"])
	if got["calls"] != 104.0 || got["ok"] != 100.0 || got["period"] != "1m0s" ||
		string(b) != `{"E_TOOL_NOT_FOUND":2,"invalid_token":1,"timeout":1}` {
		t.Errorf("calls line %v", got)
	}
	// Quantiles are within the histogram's 1.6%.
	for k, want := range map[string]time.Duration{"p50": 50 * time.Millisecond, "p99": 99 * time.Millisecond} {
		d := time.Duration(got[k].(float64))
		if d < want*98/100 || d > want*102/100 {
			t.Errorf("%s = %v, want about %v", k, d, want)
		}
	}
	s.flush() // nothing since the last line
	if n := logs.count(line("calls")); n != 1 {
		t.Errorf("%d calls lines, want 1:\n%s", n, logs)
	}
}

// TestGatewayConsole runs all-in-one with audit lines off the log and its
// calls line on a tick the test controls: the calls' audit events are
// published and kept in the audit stream but not logged, and one tick
// writes one line that counts the gateway's decisions as NATS saw them.
func TestGatewayConsole(t *testing.T) {
	tick := make(chan time.Time)
	f := startAllInOne(t, 1, func(c *AllInOneConfig) {
		c.NoAuditLog = true
		c.Gateway.AuditRetention = time.Hour
		c.Gateway.SummaryTick = tick
	})
	onBus, err := f.nc.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	tick <- time.Now() // nothing yet: no line

	s := f.client(f.token(auth.MintOptions{}), "")
	node := f.device(DefaultTenant, nil, nil)
	calls := []sdk.CallToolParams{
		{Name: echoName(node), Arguments: map[string]any{"message": "a"}},
		{Name: echoName(node), Arguments: map[string]any{"message": "b"}},
		{Name: echoName(node), Arguments: map[string]any{"message": 7}},                          // E_MANIFEST_INVALID
		{Name: "gpio." + node + ".pin.write", Arguments: map[string]any{"level": 1}},             // beyond a read-only token
		{Name: "sysecho." + device0 + ".echo.invoke", Arguments: map[string]any{"message": "x"}}, // no such node
	}
	for _, c := range calls {
		_, _ = s.CallTool(t.Context(), &c) // failures are the point
	}
	// The gateway's decisions, as published; each is counted before.
	want := map[string]int{}
	for seen := 0; seen < len(calls); {
		m, err := onBus.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d gateway decisions published: %v", seen, len(calls), err)
		}
		var e bus.AuditEvent
		if err := json.Unmarshal(m.Data, &e); err != nil || e.Actor != "gateway" {
			continue
		}
		seen++
		if e.Code == "" {
			e.Code = e.Decision
		}
		want[e.Code]++
	}
	tick <- time.Now()
	line := waitLogLine(t, f.logs, "calls")
	if line["calls"] != float64(len(calls)) || line["ok"] != float64(want[bus.DecisionAllowed]) {
		t.Errorf("calls line %v, want %d calls, %d ok (%v)", line, len(calls), want[bus.DecisionAllowed], want)
	}
	failed, _ := line["failed"].(map[string]any)
	for code, n := range want {
		if code != bus.DecisionAllowed && failed[code] != float64(n) {
			t.Errorf("calls line counts %v of %s, want %d: %v", failed[code], code, n, line)
		}
	}
	if _, ok := line["p50"]; !ok {
		t.Errorf("calls line %v has no p50", line)
	}

	js, _ := jetstream.New(f.nc)
	st, err := js.Stream(t.Context(), bus.StreamAudit)
	if err != nil {
		t.Fatalf("audit stream: %v", err)
	}
	if info, err := st.Info(t.Context()); err != nil || info.State.Msgs < uint64(len(calls)) {
		t.Errorf("audit stream holds %v, want at least the %d calls' events (%v)", info, len(calls), err)
	}
	got := f.logs.String()
	if strings.Contains(got, `"msg":"audit"`) {
		t.Errorf("audit events logged with NoAuditLog:\n%s", got)
	}
	if n := strings.Count(got, `"msg":"calls"`); n != 1 {
		t.Errorf("%d calls lines, want 1:\n%s", n, got)
	}
}

// device0 is a node id no device has.
const device0 = "01hzx9k3m4p7q8r9s0t1v2w3xy"

// waitLogLine waits for the first JSON line of logs with message msg.
func waitLogLine(t *testing.T, logs *syncBuffer, msg string) map[string]any {
	t.Helper()
	var found map[string]any
	eventually(t, "a log line "+msg, func() bool {
		for _, l := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
				found = m
				return true
			}
		}
		return false
	})
	return found
}

// TestVersion: `okso version` and `okso --version` print the same line:
// the version and the Go release okso was built with.
func TestVersion(t *testing.T) {
	var lines []string
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out bytes.Buffer
		root := NewRoot(&out, &out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("okso %s: %v", args[0], err)
		}
		lines = append(lines, out.String())
	}
	want := "okso version " + Version + " ("
	if lines[0] != lines[1] || !strings.HasPrefix(lines[0], want) || !strings.Contains(lines[0], runtime.Version()) ||
		strings.Count(lines[0], "\n") != 1 {
		t.Errorf("okso version printed %q and okso --version %q, want one line %s... naming %s",
			lines[0], lines[1], want, runtime.Version())
	}
}
