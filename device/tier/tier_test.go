package tier_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// tenant is the tenant of every device token the tests mint unless a test
// says otherwise.
const tenant = "acme"

// registryTTL keeps records for a minute, so that the sessions' lease
// refresh (every 20 s) never runs during a test and cannot mask a missing
// prompt reaction (a replaced session must be closed at once, not when its
// lease is found lost).
const registryTTL = time.Minute

// waitFor bounds every wait of the tests for an event that should come at
// once: long enough for a loaded -race run, short enough to fail quickly.
const waitFor = 5 * time.Second

// testTier is one device tier with everything real around it: an embedded
// nats-server, the tier on its own in-process connection, the tier's HTTP
// handler behind httptest, and a signer in a temporary directory. The test
// talks to NATS on a second connection, as the gateway would.
type testTier struct {
	server *bus.Server
	tier   *tier.Tier
	url    string // ws://…/v1/device/ws
	nc     *nats.Conn
	reg    *bus.Registry
	kv     jetstream.KeyValue
	signer *auth.Signer
	set    *schemas.Set
	audit  *auditLog
}

// newTestTier starts a tier configured by o; NC, Registry, Schemas,
// Verifier and Auditor are filled in. Everything stops when the test ends.
func newTestTier(t testing.TB, o tier.Options) *testTier {
	t.Helper()
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	testNC := connect(t, srv, "okso-test")
	testReg, err := bus.OpenRegistry(t.Context(), testNC, bus.RegistryOptions{TTL: registryTTL})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(testNC)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), bus.BucketNodes)
	if err != nil {
		t.Fatal(err)
	}
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tt := &testTier{
		server: srv,
		nc:     testNC,
		reg:    testReg,
		kv:     kv,
		signer: signer,
		set:    set,
		audit:  newAuditLog(),
	}
	tt.tier, tt.url = tt.startReplica(t, o)
	return tt
}

// startReplica starts one more tier on the same NATS server, with the same
// signer, schemas and audit log, and returns it with its device URL.
func (tt *testTier) startReplica(t testing.TB, o tier.Options) (*tier.Tier, string) {
	t.Helper()
	nc := connect(t, tt.server, "okso-device-tier")
	reg, err := bus.OpenRegistry(t.Context(), nc, bus.RegistryOptions{TTL: registryTTL})
	if err != nil {
		t.Fatal(err)
	}
	bindings, err := bus.OpenBindings(t.Context(), nc, bus.BindingsOptions{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	o.NC, o.Registry, o.Bindings, o.Schemas = nc, reg, bindings, tt.set
	o.Verifier = auth.NewVerifier(tt.signer.Public(), auth.AudienceDevice)
	o.Auditor = &bus.Auditor{Log: slog.New(slog.NewJSONHandler(tt.audit, nil))}
	tier, err := tier.New(o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(tier.Handler())
	t.Cleanup(func() {
		// Sessions still open get 1001 and end; then the listener stops.
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		if err := tier.Shutdown(ctx); err != nil {
			t.Errorf("tier shutdown: %v", err)
		}
		hs.Close()
	})
	return tier, "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path
}

func connect(t testing.TB, srv *bus.Server, name string) *nats.Conn {
	t.Helper()
	nc, err := srv.Connect(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// token mints a device token for node in [tenant] with device:connect.
func (tt *testTier) token(t testing.TB, node string) string {
	t.Helper()
	return tt.mint(t, auth.MintOptions{Subject: node, Tenant: tenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
}

func (tt *testTier) mint(t testing.TB, o auth.MintOptions) string {
	t.Helper()
	tok, err := tt.signer.Mint(o)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// record returns the registry record of node, or nil when there is none.
func (tt *testTier) record(t *testing.T, node string) *bus.Node {
	t.Helper()
	e, err := tt.kv.Get(t.Context(), node)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		t.Fatalf("get registry record %s: %v", node, err)
	}
	var n bus.Node
	if err := json.Unmarshal(e.Value(), &n); err != nil {
		t.Fatalf("registry record %s: %v", node, err)
	}
	return &n
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
		done <- tt.reg.Watch(ctx, func(e bus.Event) {
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
	case <-time.After(waitFor):
		t.Fatal("registry watch: no initial state")
	}
	return events
}

// waitEvent returns the first of events that match accepts.
func waitEvent(t *testing.T, events <-chan bus.Event, match func(bus.Event) bool) bus.Event {
	t.Helper()
	timeout := time.After(waitFor)
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

// callResult is the outcome of one request on a node's subject.
type callResult struct {
	reply   bus.Reply
	err     error
	elapsed time.Duration
}

func (r callResult) String() string {
	switch {
	case r.err != nil:
		return fmt.Sprintf("error %q after %v", r.err, r.elapsed)
	case r.reply.Error != nil:
		return fmt.Sprintf("reply %s after %v", r.reply.Error, r.elapsed)
	}
	return fmt.Sprintf("reply ok=%v %s after %v", r.reply.OK, r.reply.Result, r.elapsed)
}

// call sends one bus.Call for tool on node's subject as a caller of
// callerTenant, as the gateway does, and decodes the reply.
func (tt *testTier) call(ctx context.Context, node, callerTenant, tool, args string) callResult {
	b, _ := json.Marshal(bus.Call{Tool: tool, Arguments: json.RawMessage(args)})
	m := nats.NewMsg(bus.NodeCmd(node))
	m.Data = b
	m.Header.Set(bus.HeaderTenant, callerTenant)
	m.Header.Set(bus.HeaderBudgetMs, strconv.Itoa(int(waitFor/time.Millisecond)))
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

// goCall runs call on its own goroutine; the result arrives on the channel.
func (tt *testTier) goCall(ctx context.Context, node, callerTenant, tool, args string) <-chan callResult {
	ch := make(chan callResult, 1)
	go func() { ch <- tt.call(ctx, node, callerTenant, tool, args) }()
	return ch
}

// wantOK fails the test unless r is a successful reply.
func wantOK(t *testing.T, r callResult) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("call: %v", r.err)
	}
	if !r.reply.OK || r.reply.Error != nil || len(r.reply.Result) == 0 {
		t.Fatalf("call: got %v, want ok with a result", r)
	}
}

// wantCode fails the test unless r is an error reply with code.
func wantCode(t *testing.T, r callResult, code string) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("call: %v, want a %s reply", r.err, code)
	}
	if r.reply.OK || r.reply.Error == nil || r.reply.Error.Code != code {
		t.Fatalf("call: got %v, want %s", r, code)
	}
	if got, want := r.reply.Error.Category, schemas.Category(code); got != want {
		t.Errorf("call: category %q, want %q", got, want)
	}
}

// echoTool is the projected name of node's echo capability.
func echoTool(node string) string { return tool(node, "echo") }

// tool is the projected name of a system.echo capability of node.
func tool(node, capID string) string {
	return schemas.ToolName{KindShort: "sysecho", NodeID: node, CapID: capID, Verb: "invoke"}.String()
}

// echo checks that node answers an echo call.
func (tt *testTier) echo(t *testing.T, node string) {
	t.Helper()
	r := tt.call(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`)
	wantOK(t, r)
	var res echoResult
	if err := json.Unmarshal(r.reply.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Message != "hi" || res.NodeID != node {
		t.Fatalf("echo result %+v, want message hi from %s", res, node)
	}
}

// echoResult is the result of system.echo (seed 000 §4).
type echoResult struct {
	Message      string `json:"message"`
	ReceivedAtMs int64  `json:"received_at_ms"`
	NodeID       string `json:"node_id"`
}

// echoCapability is the system.echo capability as every device announces
// it (seed 000 §9), limits included: 10 calls a second, 4 at once.
func echoCapability() schemas.Capability {
	return echoCap("echo", schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000})
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
func (tt *testTier) runEcho(t *testing.T) *echoDevice { return tt.runEchoAt(t, tt.url) }

// runEchoAt is runEcho for the tier at url.
func (tt *testTier) runEchoAt(t *testing.T, url string) *echoDevice {
	t.Helper()
	node := wire.NewNodeID()
	rc := tt.dialURL(t, url, nil)
	rc.authenticate(t, tt.token(t, node))
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
		if wire.DecodePayload(e, &cmd) == nil && cmd.Tool == echoTool(d.node) && json.Unmarshal(cmd.Arguments, &in) == nil {
			res, err := json.Marshal(echoResult{Message: in.Message, ReceivedAtMs: time.Now().UnixMilli(), NodeID: d.node})
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
}

// dial opens a raw WebSocket to the tier with the okso.v1 subprotocol
// unless o says otherwise.
func (tt *testTier) dial(t *testing.T, o *websocket.DialOptions) *rawClient {
	t.Helper()
	return tt.dialURL(t, tt.url, o)
}

// dialURL is dial for the tier at url.
func (tt *testTier) dialURL(t *testing.T, url string, o *websocket.DialOptions) *rawClient {
	t.Helper()
	if o == nil {
		o = &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}}
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, o)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return &rawClient{c: c, set: tt.set}
}

func (rc *rawClient) sendRaw(t *testing.T, typ websocket.MessageType, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
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
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
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
	ctx, cancel := context.WithTimeout(t.Context(), waitFor)
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
	ok := rc.authenticate(t, tt.token(t, node))
	rc.announce(t, node, echoCapability())
	return rc, ok
}

// answerEcho reads one cmd and answers it as system.echo would.
func (rc *rawClient) answerEcho(t *testing.T, node string) {
	t.Helper()
	var cmd wire.Cmd
	e := rc.recv(t, wire.TypeCmd, &cmd)
	if cmd.Tool != echoTool(node) {
		t.Fatalf("cmd for %s, want %s", cmd.Tool, echoTool(node))
	}
	var in struct{ Message string }
	if err := json.Unmarshal(cmd.Arguments, &in); err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(echoResult{Message: in.Message, NodeID: node, ReceivedAtMs: time.Now().UnixMilli()})
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

// auditLog collects the JSON lines of a bus.Auditor's logger. It is safe for
// concurrent use.
type auditLog struct {
	mu      sync.Mutex
	lines   []auditEntry
	changed chan struct{} // closed and replaced on every write
	// keepRaw keeps each entry's whole line, for the tests that read it;
	// the others (benchmarks among them) do not pay for the copy.
	keepRaw bool
}

type auditEntry struct {
	Decision  string `json:"decision"`
	Tenant    string `json:"tenant"`
	Subject   string `json:"subject"`
	NodeID    string `json:"node_id"`
	Tool      string `json:"tool"`
	Code      string `json:"code"`
	RequestID string `json:"request_id"`
	raw       string // the whole line, if the log keeps it
}

func newAuditLog() *auditLog { return &auditLog{changed: make(chan struct{})} }

// Write takes one or more JSON lines; slog writes one record per call.
func (a *auditLog) Write(p []byte) (int, error) {
	var entries []auditEntry
	a.mu.Lock()
	keepRaw := a.keepRaw
	a.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		var e auditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return 0, err
		}
		if keepRaw {
			e.raw = sc.Text()
		}
		entries = append(entries, e)
	}
	a.mu.Lock()
	a.lines = append(a.lines, entries...)
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
	return len(p), nil
}

// wait returns the first audit entry that matches, waiting for it.
func (a *auditLog) wait(t *testing.T, match func(auditEntry) bool) auditEntry {
	t.Helper()
	timeout := time.After(waitFor)
	for seen := 0; ; {
		a.mu.Lock()
		lines, changed := a.lines, a.changed
		a.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if match(lines[seen]) {
				return lines[seen]
			}
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no matching audit event in %+v", lines)
			return auditEntry{}
		}
	}
}
