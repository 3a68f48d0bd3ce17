package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/repeats"
	"github.com/okso-io/okso/schemas"
)

// logLines decodes the JSON lines of a log.
func logLines(t *testing.T, log string) []map[string]any {
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

// roleLog is a role's log with these flags, JSON with audit lines,
// writing to a buffer, open until the test closes it.
func roleLog(t *testing.T, args ...string) (*processLog, *syncBuffer, *logFlags) {
	t.Helper()
	var logs logFlags
	fs := pflag.NewFlagSet("role", pflag.ContinueOnError)
	logs.add(fs)
	if err := fs.Parse(append([]string{"--log-format=json", "--log-audit", "--adaptive-procs=false"}, args...)); err != nil {
		t.Fatal(err)
	}
	buf := &syncBuffer{}
	log, err := logs.open(buf)
	if err != nil {
		t.Fatal(err)
	}
	return log, buf, &logs
}

// TestRepeatHandler: a warning repeated 10,000 times (as a peer could
// make the tier write one per frame) leaves its first line and, at the
// period's end, one line with how many more there were; a second role's
// same warning is a kind of its own; info lines are all written; and
// 1,000 kinds of error in one period leave 64 of them and one line for
// the others. With --log-repeats 0 every line is written.
func TestRepeatHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log, buf, _ := roleLog(t)
		tier, gw := log.With("role", "device"), log.With("role", "gateway")
		for i := range 10_000 {
			tier.Warn("publish reply", "node_id", fmt.Sprint(i), "err", "nats: connection closed")
			if i%100 == 0 {
				gw.Warn("publish reply", "err", "nats: connection closed")
				log.Info("mock devices connecting", "connected", i)
			}
		}
		time.Sleep(10 * time.Second) // the period ends
		synctest.Wait()
		for i := range 1000 {
			tier.Error(fmt.Sprintf("failed to connect: %d", i))
		}
		log.Close() // writes the last period's repeats, then the log

		var warns, infos, errs int
		more := map[string]any{}
		for _, l := range logLines(t, buf.String()) {
			switch {
			case l["more"] != nil:
				more[fmt.Sprint(l["level"], " ", l["role"], " ", l["msg"])] = l["more"]
				if l["msg"] == "publish reply" && l["in_last"] != "10s" {
					t.Errorf("in_last %v, want 10s", l["in_last"])
				}
			case l["level"] == "WARN":
				warns++
			case l["level"] == "ERROR":
				errs++
			case l["msg"] == "mock devices connecting":
				infos++
			}
		}
		t.Logf("%d bytes of log for 21,200 records", len(buf.String()))
		if warns != 2 || infos != 100 || errs != repeats.MaxKinds+1 {
			t.Errorf("%d warnings, %d info lines, %d errors written; want 2, 100, %d", warns, infos, errs, repeats.MaxKinds+1)
		}
		want := map[string]any{
			"WARN device publish reply":            float64(9999),
			"WARN gateway publish reply":           float64(99),
			"ERROR <nil> " + repeats.MsgOtherKinds: float64(1000 - repeats.MaxKinds - 1),
		}
		for k, v := range want {
			if more[k] != v {
				t.Errorf("%s: more %v, want %v", k, more[k], v)
			}
		}
		if len(more) != len(want) {
			t.Errorf("repeated lines %v, want %v", more, want)
		}

		// --log-repeats 0.
		log, buf, _ = roleLog(t, "--log-repeats=0")
		for range 100 {
			log.Warn("publish reply")
		}
		log.Close()
		if n := strings.Count(buf.String(), "\n"); n != 100 {
			t.Errorf("--log-repeats 0: %d lines of 100", n)
		}
	})
}

// dialBogusAcker connects to the tier at url as node id with a valid
// device token and announces it; then the test can send any frame.
func (f *fixture) dialBogusAcker(id string) *websocket.Conn {
	f.t.Helper()
	t := f.t
	tok, err := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, f.a.DeviceURL(), &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		t.Fatalf("dial tier: %v", err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	expect := func(typ string) {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read %s: %v", typ, err)
		}
		if e, err := wire.DecodeEnvelope(f.a.c.schemas, b); err != nil || e.Type != typ {
			t.Fatalf("tier sent %s, want %s", b, typ)
		}
	}
	send := func(typ string, payload any) {
		b, _ := wire.Encode(typ, "", payload)
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatalf("write %s: %v", typ, err)
		}
	}
	expect(wire.TypeHello)
	send(wire.TypeAuth, wire.Auth{Token: tok})
	expect(wire.TypeAuthOK)
	send(wire.TypeAnnounce, map[string]any{"node_id": id, "agent": schemas.Agent{Name: "bogus", Version: "1"},
		"capabilities": agent.MockOptions(id, f.a.c.schemas, 1).Capabilities})
	expect(wire.TypeAnnounceOK)
	// The tier reads on while no one reads the tier's frames.
	go func() {
		for {
			if _, _, err := c.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	return c
}

// TestLogBoundedUnderFlood: a device that sends bogus acks, one audit
// event each (late_ack_dropped), through a real tier into a role's log as
// okso makes it (JSON, audit lines on, --log-repeats 10s): every event is
// published on okso.v1.audit.<tenant>, and the log grows by a few lines,
// however many acks come. (Before --log-repeats it grew by a line each:
// 100,000 acks wrote 32 MB.)
func TestLogBoundedUnderFlood(t *testing.T) {
	const flood = 20_000
	log, buf, logs := roleLog(t)
	t.Cleanup(log.Close) // after the all-in-one stops
	tick := make(chan time.Time)
	f := startAllInOneLog(t, 0, func(c *AllInOneConfig) {
		c.Tier.AuditTick, c.LogRepeats = tick, logs.repeats
	}, log.Logger, buf)

	var (
		mu   sync.Mutex
		late int
		more = make(chan struct{}, 1)
	)
	sub, err := f.nc.Subscribe(bus.Audit(DefaultTenant), func(m *nats.Msg) {
		var e bus.AuditEvent
		if json.Unmarshal(m.Data, &e) == nil && e.Decision == bus.DecisionLateAck {
			mu.Lock()
			late++
			mu.Unlock()
			select {
			case more <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	defer sub.Unsubscribe()
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitLate := func(n int) {
		t.Helper()
		timeout := time.NewTimer(time.Minute)
		defer timeout.Stop()
		for {
			mu.Lock()
			got := late
			mu.Unlock()
			if got == n {
				return
			}
			select {
			case <-more:
			case <-timeout.C:
				t.Fatalf("%d of %d late_ack_dropped events published", got, n)
			}
		}
	}

	id := wire.NewNodeID()
	c := f.dialBogusAcker(id)
	ack := func() {
		b, _ := wire.Encode(wire.TypeCmdAck, wire.NewMsgID(), wire.CmdAck{OK: true, Result: json.RawMessage(`{}`)})
		if err := c.Write(t.Context(), websocket.MessageText, b); err != nil {
			t.Fatalf("write cmd_ack: %v", err)
		}
	}
	endPeriod := func(now time.Time) {
		t.Helper()
		select {
		case tick <- now:
		case <-time.After(10 * time.Second):
			t.Fatal("the tier's auditor takes no tick: its log has no periods")
		}
	}
	start := time.Now()
	endPeriod(start) // the tier's audit log begins a period
	log.out.Flush()
	before := len(buf.String())
	for range flood {
		ack()
	}
	waitLate(flood)
	endPeriod(start.Add(10 * time.Second))
	// The tier's auditor writes in order: once this event is published,
	// the lines of the period before it are written.
	ack()
	waitLate(flood + 1)
	log.out.Flush()
	grown := buf.String()[before:]
	t.Logf("%d bogus acks: %d events published, the log grew by %d bytes in %d lines (%s)",
		flood+1, flood+1, len(grown), strings.Count(grown, "\n"), time.Since(start).Round(time.Millisecond))
	if len(grown) > 64<<10 {
		t.Errorf("the log grew by %d bytes for %d bogus acks, want at most 64 KiB", len(grown), flood+1)
	}
	var repeated float64
	for _, l := range logLines(t, grown) {
		if l["msg"] == "audit repeated" && l["node_id"] == id && l["decision"] == bus.DecisionLateAck {
			repeated = l["more"].(float64)
		}
	}
	if repeated != flood-1 {
		t.Errorf("audit repeated says %v more late acks, want %d", repeated, flood-1)
	}
}
