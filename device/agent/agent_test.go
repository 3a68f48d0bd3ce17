package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// These tests play the device tier by hand, through package wire, on real
// WebSockets: the agent's tests never import the tier (device/e2e runs
// the two together).

// waitFor bounds every wait of the tests for an event that should come at
// once: long enough for a loaded -race run, short enough to fail quickly.
const waitFor = 5 * time.Second

// tenant is the tenant the hand-written tier confirms in auth_ok.
const tenant = "acme"

// rawTier is a device tier written by hand, to send an agent.Device what
// a real tier sends only when something went wrong (a cmd that arrives
// after its deadline, a malformed frame), on a real WebSocket.
type rawTier struct {
	conns chan *websocket.Conn
	url   string
	set   *schemas.Set // to decode the device's frames
}

func newRawTier(t *testing.T, set *schemas.Set) *rawTier {
	t.Helper()
	return newRawTierWith(t, set, &websocket.AcceptOptions{Subprotocols: []string{wire.Subprotocol}})
}

// newRawTierWith is newRawTier accepting with o.
func newRawTierWith(t *testing.T, set *schemas.Set, o *websocket.AcceptOptions) *rawTier {
	t.Helper()
	rt := &rawTier{conns: make(chan *websocket.Conn, 1), set: set}
	done := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, o)
		if err != nil {
			return
		}
		defer c.CloseNow()
		select {
		case rt.conns <- c:
			<-done
		case <-done:
		}
	}))
	t.Cleanup(func() {
		close(done)
		hs.Close()
	})
	rt.url = "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path
	return rt
}

// accept waits for the device's next connection.
func (rt *rawTier) accept(t *testing.T) *tierConn {
	t.Helper()
	select {
	case c := <-rt.conns:
		// Dropped before the device is stopped, which would otherwise wait
		// for this side's answer to its close.
		t.Cleanup(func() { _ = c.CloseNow() })
		return &tierConn{c: c, set: rt.set}
	case <-time.After(waitFor):
		t.Fatal("the device did not connect")
		return nil
	}
}

// tierConn is the hand-written tier's end of one device connection.
type tierConn struct {
	c   *websocket.Conn
	set *schemas.Set
}

func (tc *tierConn) sendRaw(t *testing.T, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	if err := tc.c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

func (tc *tierConn) send(t *testing.T, typ, inReplyTo string, payload any) {
	t.Helper()
	b, err := wire.Encode(typ, inReplyTo, payload)
	if err != nil {
		t.Fatal(err)
	}
	tc.sendRaw(t, b)
}

// recv reads the next frame, which must be a valid envelope of type want,
// and decodes its payload into v when v is not nil.
func (tc *tierConn) recv(t *testing.T, want string, v any) wire.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	_, b, err := tc.c.Read(ctx)
	if err != nil {
		t.Fatalf("read %s: %v", want, err)
	}
	e, err := wire.DecodeEnvelope(tc.set, b)
	if err != nil || e.Type != want {
		t.Fatalf("read %s: got %s (%v)", want, b, err)
	}
	if v != nil {
		if err := wire.DecodePayload(e, v); err != nil {
			t.Fatalf("read %s: %v", want, err)
		}
	}
	return e
}

// handshake plays the tier's side up to announce_ok, with tools, and
// returns the announce; serverTimeMs 0 plays a tier older than the
// tier clock.
func (tc *tierConn) handshake(t *testing.T, node string, serverTimeMs int64, tools ...string) wire.Envelope {
	t.Helper()
	tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
	tc.recv(t, wire.TypeAuth, nil)
	tc.send(t, wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: tenant, SessionID: wire.NewMsgID(),
		ServerTimeMs: serverTimeMs})
	e := tc.recv(t, wire.TypeAnnounce, nil)
	tc.send(t, wire.TypeAnnounceOK, e.MsgID, wire.AnnounceOK{Tools: tools})
	return e
}

// pinWrite is the projected name of node's simulated pin's write verb.
func pinWrite(node string) string {
	return schemas.ToolName{KindShort: "gpio", NodeID: node, CapID: "pin", Verb: "write"}.String()
}

// recordingPin returns mock device options for node whose pin.write
// handler counts its runs in ran.
func recordingPin(node string, set *schemas.Set, ran *atomic.Int32) agent.Options {
	o := agent.MockOptions(node, set, 1)
	o.Handlers["pin.write"] = func(context.Context, json.RawMessage) (any, error) {
		ran.Add(1)
		return map[string]any{"node_id": node, "pin": "pin", "level": 1, "ts_ms": time.Now().UnixMilli()}, nil
	}
	return o
}

// runStandalone runs an agent.Device with o until the test ends.
func runStandalone(t *testing.T, o agent.Options) {
	t.Helper()
	d, err := agent.New(o)
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
func sendCmd(t *testing.T, tc *tierConn, node string, deadlineAtMs int64) string {
	t.Helper()
	id := wire.NewMsgID()
	b, err := wire.EncodeID(wire.TypeCmd, id, "", wire.Cmd{Tool: pinWrite(node), Arguments: json.RawMessage(`{"level":1}`),
		DeadlineMs: 2000, DeadlineAtMs: deadlineAtMs})
	if err != nil {
		t.Fatal(err)
	}
	tc.sendRaw(t, b)
	return id
}

// recvAck reads the cmd_ack of cmd id.
func recvAck(t *testing.T, tc *tierConn, id string) wire.CmdAck {
	t.Helper()
	var ack wire.CmdAck
	if e := tc.recv(t, wire.TypeCmdAck, &ack); e.InReplyTo != id {
		t.Fatalf("cmd_ack in reply to %s, want %s", e.InReplyTo, id)
	}
	return ack
}

// TestDeviceRefusesLateCmd: an agent.Device that learnt its tier's clock
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
			rt := newRawTier(t, set)
			node := wire.NewNodeID()
			var ran atomic.Int32
			o := recordingPin(node, set, &ran)
			o.URLs, o.Token = []string{rt.url}, "unchecked"
			runStandalone(t, o)
			tierNow := func() int64 { return time.Now().Add(skew).UnixMilli() }

			tc := rt.accept(t)
			e := tc.handshake(t, node, tierNow(), pinWrite(node))
			var a struct {
				Features []string `json:"features"`
			}
			if err := json.Unmarshal(e.Payload, &a); err != nil || !slices.Contains(a.Features, wire.FeatureDeadlineAt) {
				t.Fatalf("announce %s, want the feature %s", e.Payload, wire.FeatureDeadlineAt)
			}

			late := sendCmd(t, tc, node, tierNow()-1000)
			if ack := recvAck(t, tc, late); ack.OK || ack.Error == nil || ack.Error.Code != schemas.CodeDeadlineExceeded {
				t.Fatalf("ack of a cmd 1 s late: %+v, want %s", ack, schemas.CodeDeadlineExceeded)
			}
			if n := ran.Load(); n != 0 {
				t.Fatalf("the handler ran %d times for a cmd past its deadline", n)
			}
			inTime := sendCmd(t, tc, node, tierNow()+2000)
			if ack := recvAck(t, tc, inTime); !ack.OK {
				t.Fatalf("ack of a cmd in time: %+v, want ok", ack)
			}
			if n := ran.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want once", n)
			}
		})
	}
	t.Run("older tier", func(t *testing.T) {
		rt := newRawTier(t, set)
		node := wire.NewNodeID()
		var ran atomic.Int32
		o := recordingPin(node, set, &ran)
		o.URLs, o.Token = []string{rt.url}, "unchecked"
		runStandalone(t, o)
		tc := rt.accept(t)
		tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
		tc.recv(t, wire.TypeAuth, nil)
		tc.send(t, wire.TypeAuthOK, "", map[string]string{"node_id": node, "tenant": tenant, "session_id": wire.NewMsgID()})
		e := tc.recv(t, wire.TypeAnnounce, nil)
		if err := set.ValidateJSON(schemas.Manifest, e.Payload); err != nil || bytes.Contains(e.Payload, []byte("features")) {
			t.Fatalf("announce to a tier without a clock: %s (%v), want the manifest without features", e.Payload, err)
		}
	})
}

// TestDeviceRefusesSmuggledFrames: a frame of the tier's that the
// envelope schema refuses (a key in another case or written twice, a
// constrained payload member out of bounds) or that the protocol does not
// expect is never acted on: the pin.write it carries does not run, the
// device closes the connection with 4400, as the tier does for a device's
// such frame, and connects again.
func TestDeviceRefusesSmuggledFrames(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	cmd := func(node string) string {
		return `{"tool":"` + pinWrite(node) + `","arguments":{"level":1},"deadline_ms":2000}`
	}
	tests := []struct {
		name  string
		frame func(node string) string
	}{
		{"type in upper case", func(node string) string {
			return `{"TYPE":"cmd","msg_id":"` + wire.NewMsgID() + `","payload":` + cmd(node) + `}`
		}},
		{"type twice, one in upper case", func(node string) string {
			return `{"type":"cancel","TYPE":"cmd","msg_id":"` + wire.NewMsgID() + `","payload":` + cmd(node) + `}`
		}},
		{"type twice", func(node string) string {
			return `{"type":"cancel","type":"cmd","msg_id":"` + wire.NewMsgID() + `","payload":` + cmd(node) + `}`
		}},
		{"payload in title case", func(node string) string {
			return `{"type":"cmd","msg_id":"` + wire.NewMsgID() + `","payload":{},"Payload":` + cmd(node) + `}`
		}},
		{"tool twice in the payload", func(node string) string {
			return `{"type":"cmd","msg_id":"` + wire.NewMsgID() + `","payload":{"tool":"nope",` + cmd(node)[1:] + `}`
		}},
		{"deadline_at_ms 0", func(node string) string {
			return `{"type":"cmd","msg_id":"` + wire.NewMsgID() + `","payload":{"deadline_at_ms":0,` + cmd(node)[1:] + `}`
		}},
		{"a hello after announce_ok", func(string) string {
			return `{"type":"hello","msg_id":"` + wire.NewMsgID() + `","payload":{"proto":"okso.v1"}}`
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRawTier(t, set)
			node := wire.NewNodeID()
			var ran atomic.Int32
			o := recordingPin(node, set, &ran)
			o.URLs, o.Token = []string{rt.url}, "unchecked"
			o.MinBackoff, o.MaxBackoff = time.Millisecond, time.Millisecond
			runStandalone(t, o)

			tc1 := rt.accept(t)
			tc1.handshake(t, node, time.Now().UnixMilli(), pinWrite(node))
			tc1.sendRaw(t, []byte(tc.frame(node)))
			ctx, cancel := context.WithTimeout(t.Context(), waitFor)
			defer cancel()
			if _, b, err := tc1.c.Read(ctx); websocket.CloseStatus(err) != wire.CloseMalformed {
				t.Fatalf("after the frame: %s, %v; want the device's close %d", b, err, wire.CloseMalformed)
			}
			rt.accept(t) // the device connects again
			if n := ran.Load(); n != 0 {
				t.Fatalf("the handler ran %d times", n)
			}
		})
	}
}

// TestWorkerArgumentsOutliveTheFrame: a cmd handed to a worker keeps its
// arguments while the device reads and answers the next frames (which it
// reads into the same memory).
func TestWorkerArgumentsOutliveTheFrame(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	node := wire.NewNodeID()
	echo := schemas.ToolName{KindShort: "sysecho", NodeID: node, CapID: "echo", Verb: "invoke"}.String()
	started, release := make(chan struct{}), make(chan struct{})
	o := agent.MockOptions(node, set, 1)
	o.Handlers["pin.write"] = func(_ context.Context, args json.RawMessage) (any, error) {
		close(started)
		<-release
		return map[string]any{"node_id": node, "args": string(args)}, nil
	}
	rt := newRawTier(t, set)
	o.URLs, o.Token = []string{rt.url}, "token"
	runStandalone(t, o)
	tc := rt.accept(t)
	tc.handshake(t, node, 0, pinWrite(node), echo)

	slow := sendCmd(t, tc, node, 0) // pin.write {"level":1}, on a worker
	select {
	case <-started:
	case <-time.After(waitFor):
		t.Fatal("pin.write did not start")
	}
	tc.send(t, wire.TypeCmd, "", wire.Cmd{Tool: echo, Arguments: json.RawMessage(`{"message":"` + strings.Repeat("x", 200) + `"}`),
		DeadlineMs: 2000})
	var ack wire.CmdAck
	tc.recv(t, wire.TypeCmdAck, &ack) // the echo's, answered while pin.write waits
	if !ack.OK {
		t.Fatalf("echo: %+v", ack)
	}
	close(release)
	ack = recvAck(t, tc, slow)
	var res struct {
		Args string `json:"args"`
	}
	if err := json.Unmarshal(ack.Result, &res); err != nil || res.Args != `{"level":1}` {
		t.Fatalf("pin.write saw the arguments %q (%v), want {\"level\":1}", res.Args, err)
	}
}
