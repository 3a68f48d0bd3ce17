package e2e_test

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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
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
	var res agent.EchoResult
	if err := json.Unmarshal(r.reply.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Message != "hi" || res.NodeID != node {
		t.Fatalf("echo result %+v, want message hi from %s", res, node)
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

// runningDevice is an agent.Device running on its own goroutine.
type runningDevice struct {
	node   string
	ready  <-chan struct{} // a value after each accepted announce but the first
	cancel context.CancelFunc
	done   chan error
}

// runDevice runs an agent.Device with o (URLs, Token and Schemas filled in
// when empty) until the test ends, and returns once the tier accepted its
// announce.
func (tt *testTier) runDevice(t testing.TB, o agent.Options) *runningDevice {
	t.Helper()
	if len(o.URLs) == 0 {
		o.URLs = []string{tt.url}
	}
	if o.Token == "" {
		o.Token = tt.token(t, o.NodeID)
	}
	if o.Schemas == nil {
		o.Schemas = tt.set
	}
	ready := make(chan struct{}, 1)
	o.OnReady = func([]string) {
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	d, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	rd := &runningDevice{node: o.NodeID, ready: ready, cancel: cancel, done: make(chan error, 1)}
	go func() { rd.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		if err := rd.stop(); err != nil {
			t.Errorf("device %s: %v", rd.node, err)
		}
	})
	select {
	case <-ready:
	case err := <-rd.done:
		rd.done <- err // for stop
		t.Fatalf("device %s stopped before it was ready: %v", rd.node, err)
	case <-time.After(waitFor):
		t.Fatalf("device %s not ready", rd.node)
	}
	return rd
}

// runMock runs a simulated device with the echo capability: a well-behaved
// bystander.
func (tt *testTier) runMock(t testing.TB) *runningDevice {
	t.Helper()
	return tt.runDevice(t, agent.MockOptions(wire.NewNodeID(), tt.set, 1))
}

// stop ends the device and returns what Run returned. It may be called
// more than once.
func (rd *runningDevice) stop() error {
	rd.cancel()
	select {
	case err := <-rd.done:
		rd.done <- err
		return err
	case <-time.After(waitFor):
		return errors.New("Run did not return")
	}
}

// echoCap is a system.echo capability with its own cap_id and constraints.
func echoCap(capID string, c schemas.Constraints) schemas.Capability {
	return schemas.Capability{
		CapID:       capID,
		Kind:        schemas.KindEcho,
		SchemaRef:   schemas.EchoInput,
		Verbs:       []string{"invoke"},
		SafetyClass: schemas.SafetyReadOnly,
		Constraints: c,
	}
}

// wait blocks until release is closed or the test ends, whichever comes
// first: a handler that waits with it never outlives a failed test.
func wait(t *testing.T, release <-chan struct{}) {
	select {
	case <-release:
	case <-t.Context().Done():
	}
}
