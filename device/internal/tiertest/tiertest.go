// Package tiertest is the harness of the device tier's tests, for tests
// only: a tier with everything real around it (an embedded nats-server,
// the tier on its own in-process connection, its HTTP handler behind
// httptest, a signer in a temporary directory), a second connection that
// calls tools over NATS as the gateway does, and the tier's audit log
// read back. The tests of package tier and of device/e2e share it; it
// imports no device end, so the tier's tests still play the device by
// hand through package wire, and device/e2e runs package agent against
// the same harness.
//
// Start a tier, connect a device to [Harness.URL] with a token from
// [Harness.Token], then call its tools:
//
//	h := tiertest.Start(t, tier.Options{})
//	// ... a device for node dials h.URL with h.Token(t, node) and announces echo
//	tiertest.WantOK(t, h.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`))
//	h.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return e.NodeID == node })
//
// Everything it starts stops when the test ends.
package tiertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// Tenant is the tenant of every device token [Harness.Token] mints.
const Tenant = "acme"

// RegistryTTL is the tiers' lease: a minute, so that a test's tier
// never misses a heartbeat (every 20 s) on a loaded machine.
const RegistryTTL = time.Minute

// WaitFor bounds every wait of the tests for an event that should come at
// once: long enough for a loaded -race run, short enough to fail quickly.
const WaitFor = 5 * time.Second

// Harness is one device tier with everything real around it. The test
// talks to NATS on a connection of its own, NC, as the gateway would.
// Make one with [Start]; its methods may be called from any goroutine
// but those that take a testing.TB, which follow testing's rules.
type Harness struct {
	Server   *bus.Server
	Tier     *tier.Tier
	URL      string // ws://…/v1/device/ws, Tier's
	NC       *nats.Conn
	Registry *bus.Registry      // on NC
	KV       jetstream.KeyValue // the registry's bucket, on NC
	Signer   *auth.Signer
	Schemas  *schemas.Set
	Audit    *AuditLog // every replica's
}

// Start starts a tier configured by o; NC, Registry, Bindings, Schemas,
// Verifier and Auditor are filled in. Everything stops when the test ends.
func Start(t testing.TB, o tier.Options) *Harness {
	t.Helper()
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	testNC := Connect(t, srv, "okso-test")
	testReg, err := bus.OpenRegistry(t.Context(), testNC, bus.RegistryOptions{TTL: RegistryTTL})
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
	h := &Harness{
		Server:   srv,
		NC:       testNC,
		Registry: testReg,
		KV:       kv,
		Signer:   signer,
		Schemas:  set,
		Audit:    newAuditLog(),
	}
	h.Tier, h.URL = h.StartReplica(t, o)
	return h
}

// StartReplica starts one more tier on the same NATS server, with the same
// signer, schemas and audit log, and returns it with its device URL. It is
// shut down, then its listener closed, when the test ends.
func (h *Harness) StartReplica(t testing.TB, o tier.Options) (*tier.Tier, string) {
	t.Helper()
	nc := Connect(t, h.Server, "okso-device-tier")
	reg, err := bus.OpenRegistry(t.Context(), nc, bus.RegistryOptions{TTL: RegistryTTL})
	if err != nil {
		t.Fatal(err)
	}
	bindings, err := bus.OpenBindings(t.Context(), nc, bus.BindingsOptions{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	o.NC, o.Registry, o.Bindings, o.Schemas = nc, reg, bindings, h.Schemas
	o.Verifier = auth.NewVerifier(h.Signer.Public(), auth.AudienceDevice)
	o.Auditor = &bus.Auditor{Log: slog.New(slog.NewJSONHandler(h.Audit, nil))}
	tier, err := tier.New(o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(tier.Handler())
	t.Cleanup(func() {
		// Sessions still open get 1001 and end; then the listener stops.
		ctx, cancel := context.WithTimeout(context.Background(), WaitFor)
		defer cancel()
		if err := tier.Shutdown(ctx); err != nil {
			t.Errorf("tier shutdown: %v", err)
		}
		hs.Close()
	})
	return tier, "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path
}

// Connect opens an in-process connection to srv named name, closed when
// the test ends.
func Connect(t testing.TB, srv *bus.Server, name string) *nats.Conn {
	t.Helper()
	nc, err := srv.Connect(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Token mints a device token for node in [Tenant] with device:connect.
func (h *Harness) Token(t testing.TB, node string) string {
	t.Helper()
	return h.Mint(t, auth.MintOptions{Subject: node, Tenant: Tenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
}

// Mint mints a token with the harness's signer, as o says.
func (h *Harness) Mint(t testing.TB, o auth.MintOptions) string {
	t.Helper()
	tok, err := h.Signer.Mint(o)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Record returns the registry record of node, or nil when there is none.
func (h *Harness) Record(t *testing.T, node string) *bus.Node {
	t.Helper()
	e, err := h.KV.Get(t.Context(), node)
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

// CallResult is the outcome of one request on a node's subject.
type CallResult struct {
	Reply   bus.Reply
	Err     error // of the request, or the reply's decoding
	Elapsed time.Duration
}

func (r CallResult) String() string {
	switch {
	case r.Err != nil:
		return fmt.Sprintf("error %q after %v", r.Err, r.Elapsed)
	case r.Reply.Error != nil:
		return fmt.Sprintf("reply %s after %v", r.Reply.Error, r.Elapsed)
	}
	return fmt.Sprintf("reply ok=%v %s after %v", r.Reply.OK, r.Reply.Result, r.Elapsed)
}

// CallMsg is the request [Harness.Call] sends: one bus.Call for tool on
// node's subject as a caller of callerTenant, with a budget of [WaitFor]
// and a fresh request ID, as the gateway sends it. A test that needs other
// headers sets them and sends it with [Harness.Request].
func CallMsg(node, callerTenant, tool, args string) *nats.Msg {
	b, _ := json.Marshal(bus.Call{Tool: tool, Arguments: json.RawMessage(args)})
	m := nats.NewMsg(bus.NodeCmd(node))
	m.Data = b
	m.Header.Set(bus.HeaderTenant, callerTenant)
	m.Header.Set(bus.HeaderBudgetMs, strconv.Itoa(int(WaitFor/time.Millisecond)))
	m.Header.Set(bus.HeaderRequestID, wire.NewMsgID())
	return m
}

// Request sends m on NC, waits for the reply at most [WaitFor], and
// decodes it.
func (h *Harness) Request(ctx context.Context, m *nats.Msg) CallResult {
	ctx, cancel := context.WithTimeout(ctx, WaitFor)
	defer cancel()
	start := time.Now()
	resp, err := h.NC.RequestMsgWithContext(ctx, m)
	r := CallResult{Err: err, Elapsed: time.Since(start)}
	if err == nil {
		if err := json.Unmarshal(resp.Data, &r.Reply); err != nil {
			r.Err = errors.New("reply does not decode: " + string(resp.Data))
		}
	}
	return r
}

// Call sends one bus.Call for tool on node's subject as a caller of
// callerTenant, as the gateway does, and decodes the reply.
func (h *Harness) Call(ctx context.Context, node, callerTenant, tool, args string) CallResult {
	return h.Request(ctx, CallMsg(node, callerTenant, tool, args))
}

// GoCall runs Call on its own goroutine; the result arrives on the
// channel.
func (h *Harness) GoCall(ctx context.Context, node, callerTenant, tool, args string) <-chan CallResult {
	ch := make(chan CallResult, 1)
	go func() { ch <- h.Call(ctx, node, callerTenant, tool, args) }()
	return ch
}

// WantOK fails the test unless r is a successful reply.
func WantOK(t *testing.T, r CallResult) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("call: %v", r.Err)
	}
	if !r.Reply.OK || r.Reply.Error != nil || len(r.Reply.Result) == 0 {
		t.Fatalf("call: got %v, want ok with a result", r)
	}
}

// WantCode fails the test unless r is an error reply with code.
func WantCode(t *testing.T, r CallResult, code string) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("call: %v, want a %s reply", r.Err, code)
	}
	if r.Reply.OK || r.Reply.Error == nil || r.Reply.Error.Code != code {
		t.Fatalf("call: got %v, want %s", r, code)
	}
	if got, want := r.Reply.Error.Category, schemas.Category(code); got != want {
		t.Errorf("call: category %q, want %q", got, want)
	}
}

// EchoTool is the projected name of node's echo capability.
func EchoTool(node string) string { return Tool(node, "echo") }

// Tool is the projected name of a system.echo capability of node.
func Tool(node, capID string) string {
	return schemas.ToolName{KindShort: "sysecho", NodeID: node, CapID: capID, Verb: "invoke"}.String()
}

// EchoCap is a system.echo capability with its own cap_id and constraints.
func EchoCap(capID string, c schemas.Constraints) schemas.Capability {
	return schemas.Capability{
		CapID:       capID,
		Kind:        schemas.KindEcho,
		SchemaRef:   schemas.EchoInput,
		Verbs:       []string{"invoke"},
		SafetyClass: schemas.SafetyReadOnly,
		Constraints: c,
	}
}

// EchoResult is the result of system.echo (seed 000 §4).
type EchoResult struct {
	Message      string `json:"message"`
	ReceivedAtMs int64  `json:"received_at_ms"`
	NodeID       string `json:"node_id"`
}

// Echo checks that node answers an echo call.
func (h *Harness) Echo(t *testing.T, node string) {
	t.Helper()
	r := h.Call(t.Context(), node, Tenant, EchoTool(node), `{"message":"hi"}`)
	WantOK(t, r)
	var res EchoResult
	if err := json.Unmarshal(r.Reply.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.Message != "hi" || res.NodeID != node {
		t.Fatalf("echo result %+v, want message hi from %s", res, node)
	}
}

// AuditLog collects the JSON lines of a bus.Auditor's logger: the
// harness's tiers write theirs to [Harness.Audit]. It is safe for
// concurrent use.
type AuditLog struct {
	mu      sync.Mutex
	lines   []AuditEntry
	changed chan struct{} // closed and replaced on every write
	// keepRaw keeps each entry's whole line, for the tests that read it;
	// the others (benchmarks among them) do not pay for the copy.
	keepRaw bool
}

// AuditEntry is one audit event, the fields the tests look at.
type AuditEntry struct {
	Decision  string `json:"decision"`
	Tenant    string `json:"tenant"`
	Subject   string `json:"subject"`
	NodeID    string `json:"node_id"`
	Tool      string `json:"tool"`
	Code      string `json:"code"`
	RequestID string `json:"request_id"`
	Raw       string `json:"-"` // the whole line, once KeepRaw was called
}

func newAuditLog() *AuditLog { return &AuditLog{changed: make(chan struct{})} }

// KeepRaw makes the entries written from now on keep their whole line in
// Raw.
func (a *AuditLog) KeepRaw() {
	a.mu.Lock()
	a.keepRaw = true
	a.mu.Unlock()
}

// Write takes one or more JSON lines; slog writes one record per call.
func (a *AuditLog) Write(p []byte) (int, error) {
	var entries []AuditEntry
	a.mu.Lock()
	keepRaw := a.keepRaw
	a.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(p))
	for sc.Scan() {
		var e AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return 0, err
		}
		if keepRaw {
			e.Raw = sc.Text()
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

// Wait returns the first audit entry that matches, waiting for it at most
// [WaitFor].
func (a *AuditLog) Wait(t *testing.T, match func(AuditEntry) bool) AuditEntry {
	t.Helper()
	timeout := time.After(WaitFor)
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
			return AuditEntry{}
		}
	}
}

// Entries returns the audit entries written so far.
func (a *AuditLog) Entries() []AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.lines)
}

// Count returns how many audit entries match, now.
func (a *AuditLog) Count(match func(AuditEntry) bool) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, e := range a.lines {
		if match(e) {
			n++
		}
	}
	return n
}
