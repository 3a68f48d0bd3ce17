package device_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// pinWrite is the projected name of node's simulated pin's write verb.
func pinWrite(node string) string {
	return bus.ToolName{KindShort: "gpio", NodeID: node, CapID: "pin", Verb: "write"}.String()
}

// recordingPin returns mock device options for node whose pin.write
// handler counts its runs in ran.
func recordingPin(node string, set *schemas.Set, ran *atomic.Int32) device.Options {
	o := device.MockOptions(node, set, 1)
	o.Handlers["pin.write"] = func(context.Context, json.RawMessage) (any, error) {
		ran.Add(1)
		return map[string]any{"node_id": node, "pin": "pin", "level": 1, "ts_ms": time.Now().UnixMilli()}, nil
	}
	return o
}

// callWithDeadline is tt.call with the gateway's absolute deadline too.
func (tt *testTier) callWithDeadline(ctx context.Context, node, tool, args string, budget time.Duration, deadline time.Time) callResult {
	b, _ := json.Marshal(bus.Call{Tool: tool, Arguments: json.RawMessage(args)})
	m := nats.NewMsg(bus.NodeCmd(node))
	m.Data = b
	m.Header.Set(bus.HeaderTenant, tenant)
	m.Header.Set(bus.HeaderBudgetMs, strconv.Itoa(int(budget/time.Millisecond)))
	m.Header.Set(bus.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	m.Header.Set(bus.HeaderRequestID, wire.NewMsgID())
	ctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	start := time.Now()
	resp, err := tt.nc.RequestMsgWithContext(ctx, m)
	r := callResult{err: err, elapsed: time.Since(start)}
	if err == nil {
		if err := json.Unmarshal(resp.Data, &r.reply); err != nil {
			r.err = errors.New("reply does not decode: " + string(resp.Data))
		}
	}
	return r
}

// TestCallPastItsDeadline: a call whose Okso-Deadline has passed (it was
// held somewhere while its caller gave up) is answered
// E_DEADLINE_EXCEEDED and audited, and never reaches the device, however
// much budget it still claims. The same call within its deadline does.
func TestCallPastItsDeadline(t *testing.T) {
	tt := newTestTier(t, device.TierOptions{})
	var ran atomic.Int32
	d := tt.runDevice(t, recordingPin(wire.NewNodeID(), tt.set, &ran))
	name := pinWrite(d.node)

	r := tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(-10*time.Second))
	wantCode(t, r, bus.CodeDeadlineExceeded)
	tt.audit.wait(t, func(e auditEntry) bool {
		return e.Decision == bus.DecisionTimeout && e.Code == bus.CodeDeadlineExceeded && e.Tool == name
	})
	// The same call in time runs: the handler was there to run.
	wantOK(t, tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(5*time.Second)))
	if n := ran.Load(); n != 1 {
		t.Fatalf("pin.write ran %d times, want once: the call past its deadline must not run", n)
	}
}

// TestCallBoundByItsDeadline: a call runs until the earlier of its budget
// and its deadline, here the deadline, far shorter than the capability's
// 60 s and the budget's.
func TestCallBoundByItsDeadline(t *testing.T) {
	tt := newTestTier(t, device.TierOptions{})
	node := wire.NewNodeID()
	o := device.Options{NodeID: node, Capabilities: []bus.Capability{echoCap("slow", bus.Constraints{DeadlineMsDefault: 60000})},
		Handlers: map[string]device.Handler{"slow.invoke": func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-ctx.Done() // the tier's cancel, or the device's own deadline
			return nil, ctx.Err()
		}}}
	tt.runDevice(t, o)
	r := tt.callWithDeadline(t.Context(), node, tool(node, "slow"), `{"message":"hi"}`, time.Minute,
		time.Now().Add(300*time.Millisecond))
	wantCode(t, r, bus.CodeDeadlineExceeded)
	if r.elapsed < 300*time.Millisecond {
		t.Errorf("call ended after %v, before its deadline", r.elapsed)
	}
}

// TestCmdDeadlineAt: a device that announces the feature deadline_at
// gets cmds with deadline_at_ms on the clock of its auth_ok; one that
// does not gets cmds an older device's strict decoder still reads.
func TestCmdDeadlineAt(t *testing.T) {
	tt := newTestTier(t, device.TierOptions{})
	t.Run("announced", func(t *testing.T) {
		node := wire.NewNodeID()
		rc := tt.dial(t, nil)
		rc.recv(t, wire.TypeHello, nil)
		authAt := time.Now() // before the tier can read its clock for auth_ok
		rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.token(t, node)})
		var ok wire.AuthOK
		rc.recv(t, wire.TypeAuthOK, &ok)
		if d := time.Duration(authAt.UnixMilli()-ok.ServerTimeMs) * time.Millisecond; d < -time.Second || d > time.Second {
			t.Fatalf("auth_ok server_time_ms %d, %v from this host's clock", ok.ServerTimeMs, d)
		}
		m := manifest(node, echoCap("slow", bus.Constraints{DeadlineMsDefault: 1500}))
		m["features"] = []string{wire.FeatureDeadlineAt, "not_yet_invented"}
		rc.send(t, wire.TypeAnnounce, "", m)
		rc.recv(t, wire.TypeAnnounceOK, nil)
		res := tt.goCall(t.Context(), node, tenant, tool(node, "slow"), `{"message":"hi"}`)
		var cmd wire.Cmd
		rc.recv(t, wire.TypeCmd, &cmd)
		elapsed := time.Since(authAt).Milliseconds()
		if got := cmd.DeadlineAtMs - ok.ServerTimeMs; got < 1500 || got > 1500+elapsed+1 {
			t.Errorf("deadline_at_ms is server_time_ms + %d, want the 1500 ms deadline after at most %d ms", got, elapsed)
		}
		rc.recv(t, wire.TypeCancel, nil)
		wantCode(t, <-res, bus.CodeDeadlineExceeded)
	})
	t.Run("not announced", func(t *testing.T) {
		node := wire.NewNodeID()
		rc, _ := tt.connectRaw(t, node)
		res := tt.goCall(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`)
		e := rc.recv(t, wire.TypeCmd, nil)
		var old struct { // the cmd of okso.v1 before deadline_at_ms
			Tool       string          `json:"tool"`
			Arguments  json.RawMessage `json:"arguments"`
			DeadlineMs int             `json:"deadline_ms"`
			RequestID  string          `json:"request_id,omitempty"`
		}
		dec := json.NewDecoder(bytes.NewReader(e.Payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&old); err != nil {
			t.Fatalf("cmd %s does not decode as before: %v", e.Payload, err)
		}
		rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true,
			Result: json.RawMessage(`{"message":"hi","received_at_ms":1,"node_id":"` + node + `"}`)})
		wantOK(t, <-res)
	})
}

// rawTier is a device tier written by hand, to send a device.Device what
// a real tier sends only when something went wrong (a cmd that arrives
// after its deadline), on a real WebSocket.
type rawTier struct {
	conns chan *websocket.Conn
	url   string
}

func newRawTier(t *testing.T) *rawTier {
	t.Helper()
	rt := &rawTier{conns: make(chan *websocket.Conn, 1)}
	done := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.Subprotocol}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		rt.conns <- c
		<-done
	}))
	t.Cleanup(func() {
		close(done)
		hs.Close()
	})
	rt.url = "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path
	return rt
}

// accept waits for the device's connection.
func (rt *rawTier) accept(t *testing.T) *rawClient {
	t.Helper()
	select {
	case c := <-rt.conns:
		// Dropped before the device is stopped, which would otherwise wait
		// for this side's answer to its close.
		t.Cleanup(func() { _ = c.CloseNow() })
		return &rawClient{c: c}
	case <-time.After(waitFor):
		t.Fatal("the device did not connect")
		return nil
	}
}

// TestDeviceRefusesLateCmd: a device.Device that learnt its tier's clock
// at auth_ok refuses a cmd whose deadline_at_ms has passed by that clock
// (cmd_ack E_DEADLINE_EXCEEDED, handler never run) and runs one in time,
// whether the tier's clock is its own or hours away.
func TestDeviceRefusesLateCmd(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, skew := range []time.Duration{0, time.Hour, -3 * time.Hour} {
		t.Run("tier clock "+skew.String()+" off", func(t *testing.T) {
			rt := newRawTier(t)
			node := wire.NewNodeID()
			var ran atomic.Int32
			o := recordingPin(node, set, &ran)
			o.URLs, o.Token = []string{rt.url}, "unchecked"
			runStandalone(t, o)
			tierNow := func() int64 { return time.Now().Add(skew).UnixMilli() }

			rc := rt.accept(t)
			rc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
			rc.recv(t, wire.TypeAuth, nil)
			rc.send(t, wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: tenant, SessionID: wire.NewMsgID(),
				ServerTimeMs: tierNow()})
			var a struct {
				Features []string `json:"features"`
			}
			e := rc.recv(t, wire.TypeAnnounce, nil)
			if err := json.Unmarshal(e.Payload, &a); err != nil || !slices.Contains(a.Features, wire.FeatureDeadlineAt) {
				t.Fatalf("announce %s, want the feature %s", e.Payload, wire.FeatureDeadlineAt)
			}
			rc.send(t, wire.TypeAnnounceOK, e.MsgID, wire.AnnounceOK{Tools: []string{pinWrite(node)}})

			late := sendCmd(t, rc, node, tierNow()-1000)
			if ack := recvAck(t, rc, late); ack.OK || ack.Error == nil || ack.Error.Code != bus.CodeDeadlineExceeded {
				t.Fatalf("ack of a cmd 1 s late: %+v, want %s", ack, bus.CodeDeadlineExceeded)
			}
			if n := ran.Load(); n != 0 {
				t.Fatalf("the handler ran %d times for a cmd past its deadline", n)
			}
			inTime := sendCmd(t, rc, node, tierNow()+2000)
			if ack := recvAck(t, rc, inTime); !ack.OK {
				t.Fatalf("ack of a cmd in time: %+v, want ok", ack)
			}
			if n := ran.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want once", n)
			}
		})
	}
	t.Run("older tier", func(t *testing.T) {
		rt := newRawTier(t)
		node := wire.NewNodeID()
		var ran atomic.Int32
		o := recordingPin(node, set, &ran)
		o.URLs, o.Token = []string{rt.url}, "unchecked"
		runStandalone(t, o)
		rc := rt.accept(t)
		rc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
		rc.recv(t, wire.TypeAuth, nil)
		rc.send(t, wire.TypeAuthOK, "", map[string]string{"node_id": node, "tenant": tenant, "session_id": wire.NewMsgID()})
		e := rc.recv(t, wire.TypeAnnounce, nil)
		if err := set.ValidateJSON(schemas.Manifest, e.Payload); err != nil || bytes.Contains(e.Payload, []byte("features")) {
			t.Fatalf("announce to a tier without a clock: %s (%v), want the manifest without features", e.Payload, err)
		}
	})
}

// runStandalone runs a device.Device with o until the test ends.
func runStandalone(t *testing.T, o device.Options) {
	t.Helper()
	d, err := device.NewDevice(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitFor):
			t.Error("device Run did not return")
		}
	})
}

// sendCmd sends a pin.write cmd with deadline_at_ms and returns its id.
func sendCmd(t *testing.T, rc *rawClient, node string, deadlineAtMs int64) string {
	t.Helper()
	id := wire.NewMsgID()
	b, err := wire.EncodeID(wire.TypeCmd, id, "", wire.Cmd{Tool: pinWrite(node), Arguments: json.RawMessage(`{"level":1}`),
		DeadlineMs: 2000, DeadlineAtMs: deadlineAtMs})
	if err != nil {
		t.Fatal(err)
	}
	rc.sendRaw(t, websocket.MessageText, b)
	return id
}

// recvAck reads the cmd_ack of cmd id.
func recvAck(t *testing.T, rc *rawClient, id string) wire.CmdAck {
	t.Helper()
	var ack wire.CmdAck
	if e := rc.recv(t, wire.TypeCmdAck, &ack); e.InReplyTo != id {
		t.Fatalf("cmd_ack in reply to %s, want %s", e.InReplyTo, id)
	}
	return ack
}
