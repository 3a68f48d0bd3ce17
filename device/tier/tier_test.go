package tier_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/internal/wsframe"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// testTier is a [tiertest.Harness] with this package's own helpers on
// it: devices written by hand, raw clients, a registry watch.
type testTier struct{ *tiertest.Harness }

// newTestTier starts a tier configured by o with tiertest.Start.
func newTestTier(t testing.TB, o tier.Options) *testTier {
	t.Helper()
	return &testTier{tiertest.Start(t, o)}
}

// watch starts a registry watch and returns its changes after the initial
// state. The watch stops when the test ends.
func (tt *testTier) watch(t *testing.T) <-chan bus.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	events := make(chan bus.Event, 64)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- tt.Registry.Watch(ctx, func(e bus.Event) {
			if e.Initial {
				return
			}
			select {
			case events <- e:
			case <-ctx.Done():
			}
		}, func() { close(ready) })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("registry watch: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("registry watch: %v", err)
	case <-time.After(tiertest.WaitFor):
		t.Fatal("registry watch: no initial state")
	}
	return events
}

// waitEvent returns the first of events that match accepts.
// leftEvent reports whether e marks node offline, as a session that
// ends does.
func leftEvent(e bus.Event, node string) bool {
	return e.NodeID == node && e.Node != nil && e.Node.Offline()
}

func waitEvent(t *testing.T, events <-chan bus.Event, match func(bus.Event) bool) bus.Event {
	t.Helper()
	timeout := time.After(tiertest.WaitFor)
	for {
		select {
		case e := <-events:
			if match(e) {
				return e
			}
		case <-timeout:
			t.Fatal("no matching registry event")
			return bus.Event{}
		}
	}
}

// echoCapability is the system.echo capability as every device announces
// it (seed 000 §9), limits included: 10 calls a second, 4 at once.
func echoCapability() schemas.Capability {
	return tiertest.EchoCap("echo", schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000})
}

// echoDevice is a device written by hand with the echo capability that
// answers each cmd at once: a well-behaved bystander. It serves on its
// own goroutine until its connection closes or the test ends.
type echoDevice struct {
	node string
	rc   *rawClient
	done chan struct{} // closed when serve has returned
}

// runEcho connects an echo device to the test's tier and serves it until
// the test ends.
func (tt *testTier) runEcho(t *testing.T) *echoDevice { return tt.runEchoAt(t, tt.URL) }

// runEchoAt is runEcho for the tier at url.
func (tt *testTier) runEchoAt(t *testing.T, url string) *echoDevice {
	t.Helper()
	node := wire.NewNodeID()
	rc := tt.dialURL(t, url, nil)
	rc.authenticate(t, tt.Token(t, node))
	rc.announce(t, node, echoCapability())
	d := &echoDevice{node: node, rc: rc, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	go func() {
		defer close(d.done)
		d.serve(ctx, t)
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	return d
}

// serve answers cmds until the connection closes or ctx ends; tier
// frames that are not cmds (a cancel of an expired one) are read and
// dropped.
func (d *echoDevice) serve(ctx context.Context, t *testing.T) {
	for {
		_, b, err := d.rc.c.Read(ctx)
		if err != nil {
			return // closed: by the test, the tier, or ctx
		}
		e, err := wire.DecodeEnvelope(d.rc.set, b)
		if err != nil {
			t.Errorf("echo device: the tier sent %s: %v", b, err)
			return
		}
		if e.Type != wire.TypeCmd {
			continue
		}
		ack := wire.CmdAck{Error: &wire.AckError{Code: schemas.CodeToolNotFound}}
		var cmd wire.Cmd
		var in struct {
			Message string `json:"message"`
		}
		if wire.DecodePayload(e, &cmd) == nil && cmd.Tool == tiertest.EchoTool(d.node) && json.Unmarshal(cmd.Arguments, &in) == nil {
			res, err := json.Marshal(tiertest.EchoResult{Message: in.Message, ReceivedAtMs: time.Now().UnixMilli(), NodeID: d.node})
			if err != nil {
				t.Errorf("echo device: %v", err)
				return
			}
			ack = wire.CmdAck{OK: true, Result: res}
		}
		b, err = wire.Encode(wire.TypeCmdAck, e.MsgID, ack)
		if err != nil {
			t.Errorf("echo device: %v", err)
			return
		}
		if err := d.rc.c.Write(ctx, websocket.MessageText, b); err != nil {
			return // closed meanwhile
		}
	}
}

// leave closes the device's connection normally, as a device that shuts
// down does, and waits for it to stop serving.
func (d *echoDevice) leave(t *testing.T) {
	t.Helper()
	if err := d.rc.c.Close(websocket.StatusNormalClosure, "device shutting down"); err != nil {
		t.Errorf("echo device: close: %v", err)
	}
	<-d.done
}

// rawClient is a device written by hand, to break the protocol on purpose.
type rawClient struct {
	c   *websocket.Conn
	set *schemas.Set // to decode the tier's frames
	// body is the connection under c, where the device's heartbeats go
	// (Beat).
	body *wsframe.Body
}

// dial opens a raw WebSocket to the tier with the okso.v1 subprotocol
// unless o says otherwise.
func (tt *testTier) dial(t *testing.T, o *websocket.DialOptions) *rawClient {
	t.Helper()
	return tt.dialURL(t, tt.URL, o)
}

// dialURL is dial for the tier at url.
func (tt *testTier) dialURL(t *testing.T, url string, o *websocket.DialOptions) *rawClient {
	t.Helper()
	if o == nil {
		o = &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}}
	}
	dial := *o
	dial.HTTPClient = wsframe.Client(o.HTTPClient)
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	ctx, body := wsframe.WithBody(ctx)
	c, resp, err := websocket.Dial(ctx, url, &dial)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return &rawClient{c: c, set: tt.Schemas, body: *body}
}

func (rc *rawClient) sendRaw(t *testing.T, typ websocket.MessageType, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	if err := rc.c.Write(ctx, typ, b); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

func (rc *rawClient) send(t *testing.T, typ, inReplyTo string, payload any) {
	t.Helper()
	b, err := wire.Encode(typ, inReplyTo, payload)
	if err != nil {
		t.Fatal(err)
	}
	rc.sendRaw(t, websocket.MessageText, b)
}

// recv reads the next frame, which must be a valid envelope of type want,
// and decodes its payload into v when v is not nil.
func (rc *rawClient) recv(t *testing.T, want string, v any) wire.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	typ, b, err := rc.c.Read(ctx)
	if err != nil {
		t.Fatalf("read %s: %v", want, err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("read %s: got a binary frame", want)
	}
	e, err := wire.DecodeEnvelope(rc.set, b)
	if err != nil {
		t.Fatalf("read %s: %v in %s", want, err, b)
	}
	if e.Type != want {
		t.Fatalf("read %s: got %s", want, b)
	}
	if v != nil {
		if err := wire.DecodePayload(e, v); err != nil {
			t.Fatalf("read %s: %v", want, err)
		}
	}
	return e
}

// waitClose reads until the tier closes the connection and returns the
// close code and the error frames that came before it. Any other frame
// fails the test.
func (rc *rawClient) waitClose(t *testing.T) (websocket.StatusCode, []wire.ErrorFrame) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	var frames []wire.ErrorFrame
	for {
		_, b, err := rc.c.Read(ctx)
		if err != nil {
			code := websocket.CloseStatus(err)
			if code == -1 {
				t.Fatalf("read: %v, want a close frame", err)
			}
			return code, frames
		}
		e, err := wire.DecodeEnvelope(rc.set, b)
		if err != nil || e.Type != wire.TypeError {
			t.Fatalf("got frame %s, want an error frame or a close", b)
		}
		var f wire.ErrorFrame
		if err := wire.DecodePayload(e, &f); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
}

// authenticate reads hello, sends an auth frame with token and returns
// auth_ok.
func (rc *rawClient) authenticate(t *testing.T, token string) wire.AuthOK {
	t.Helper()
	rc.recv(t, wire.TypeHello, nil)
	rc.send(t, wire.TypeAuth, "", wire.Auth{Token: token})
	var ok wire.AuthOK
	rc.recv(t, wire.TypeAuthOK, &ok)
	return ok
}

// announce sends a manifest and returns the announce_ok.
func (rc *rawClient) announce(t *testing.T, node string, caps ...schemas.Capability) wire.AnnounceOK {
	t.Helper()
	rc.send(t, wire.TypeAnnounce, "", manifest(node, caps...))
	var ok wire.AnnounceOK
	rc.recv(t, wire.TypeAnnounceOK, &ok)
	return ok
}

// connectRaw runs the whole handshake of a raw client for node with the
// echo capability and returns it with its auth_ok.
func (tt *testTier) connectRaw(t *testing.T, node string) (*rawClient, wire.AuthOK) {
	t.Helper()
	rc := tt.dial(t, nil)
	ok := rc.authenticate(t, tt.Token(t, node))
	rc.announce(t, node, echoCapability())
	return rc, ok
}

// answerEcho reads one cmd and answers it as system.echo would.
func (rc *rawClient) answerEcho(t *testing.T, node string) {
	t.Helper()
	var cmd wire.Cmd
	e := rc.recv(t, wire.TypeCmd, &cmd)
	if cmd.Tool != tiertest.EchoTool(node) {
		t.Fatalf("cmd for %s, want %s", cmd.Tool, tiertest.EchoTool(node))
	}
	var in struct{ Message string }
	if err := json.Unmarshal(cmd.Arguments, &in); err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(tiertest.EchoResult{Message: in.Message, NodeID: node, ReceivedAtMs: time.Now().UnixMilli()})
	rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: res})
}

// manifest is an announce payload.
func manifest(node string, caps ...schemas.Capability) map[string]any {
	return map[string]any{
		"node_id":      node,
		"agent":        schemas.Agent{Name: "raw-test", Version: "1.0.0"},
		"capabilities": caps,
	}
}
