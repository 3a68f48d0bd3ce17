package roles

// Hostile-input tests through the whole stack (issue 5): gateway, NATS,
// tier and devices of an all-in-one. Each test asserts the exact answer to
// one kind of abuse, asserts that other devices and clients are
// unaffected, and logs one line
//
//	HOSTILE | <input> | <observed result>
//
// so the table of the issue can be collected from `go test -v -run Hostile`.

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// tenantB is the other tenant of the cross-tenant tests.
const tenantB = "tenant-b"

// hostile logs one row of the hostile-input table.
func hostile(t *testing.T, input, format string, args ...any) {
	t.Helper()
	t.Logf("HOSTILE | %s | %s", input, fmt.Sprintf(format, args...))
}

// hostileDevice connects a mock device of tenant (echo, metrics, GPIO pin)
// after edit changed its options, and waits until the gateway lists it.
// edit gets the node id first, so handlers can answer for it.
func (f *fixture) hostileDevice(tenant string, edit func(id string, o *agent.Options)) string {
	f.t.Helper()
	id, _ := f.connectDevice(tenant, edit)
	return id
}

// unlimitedEcho lifts the echo capability's rate limit (10 calls a second
// in the mock): bystanders are called after every hostile case.
func unlimitedEcho(_ string, o *agent.Options) {
	for i := range o.Capabilities {
		if o.Capabilities[i].CapID == "echo" {
			o.Capabilities[i].Constraints = schemas.Constraints{DeadlineMsDefault: 2000}
		}
	}
}

// countInvocations makes every handler and stream handler of o count its
// invocations in n: a device that must never be reached.
func countInvocations(o *agent.Options, n *atomic.Int64) {
	for k, h := range o.Handlers {
		o.Handlers[k] = func(ctx context.Context, args json.RawMessage) (any, error) {
			n.Add(1)
			return h(ctx, args)
		}
	}
	for k, h := range o.Streams {
		o.Streams[k] = func(ctx context.Context, args json.RawMessage, emit func(any) error) error {
			n.Add(1)
			return h(ctx, args, emit)
		}
	}
}

// echoWorks fails the test unless s lists node's echo tool and calling it
// answers.
func echoWorks(t *testing.T, s *sdk.ClientSession, node string) {
	t.Helper()
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatalf("bystander list: %v", err)
	}
	listed := false
	for _, tl := range list.Tools {
		listed = listed || tl.Name == listedName(echoName(node))
	}
	if !listed {
		t.Fatalf("bystander list lacks %s", echoName(node))
	}
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoName(node), Arguments: map[string]any{"message": "hi"}})
	if err != nil {
		t.Fatalf("bystander call: %v", err)
	}
	if res.IsError {
		t.Fatalf("bystander call failed: %+v", res.StructuredContent)
	}
	var out agent.EchoResult
	b, _ := json.Marshal(res.StructuredContent)
	if json.Unmarshal(b, &out) != nil || out.Message != "hi" || out.NodeID != node {
		t.Fatalf("bystander call result %s", b)
	}
}

// restError decodes the error envelope of a REST/SSE door response.
func restError(t *testing.T, resp *http.Response) schemas.Error {
	t.Helper()
	defer resp.Body.Close()
	var e schemas.Error
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("status %d: body is no error envelope: %v", resp.StatusCode, err)
	}
	return e
}

// TestHostileWrongToolResult: a device that answers an echo call with the
// result of another tool (a metrics snapshot, a GPIO read: each valid for
// its own tool and for the right node) gets its caller an isError result
// with E_INTERNAL, never the bogus result, on the MCP and the REST door;
// a bystander client keeps listing and calling a well-behaved device.
func TestHostileWrongToolResult(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	good := f.hostileDevice(DefaultTenant, unlimitedEcho)
	tok := f.token(auth.MintOptions{})
	s := f.client(tok, "")
	bystander := f.client(f.token(auth.MintOptions{Subject: "bystander"}), "")
	now := time.Now().UnixMilli()
	cases := []struct {
		name   string
		schema string // the tool the bogus result belongs to
		result func(node string) any
		marker string // a key only the bogus result has
	}{
		{"metrics snapshot result to an echo call", schemas.MetricsSnapshot, func(node string) any {
			return agent.MetricsSample{TsMs: now, NodeID: node, CPUPct: 12.5, MemBytes: 1 << 20,
				MemTotalBytes: 1 << 30, DiskPct: 42}
		}, "cpu_pct"},
		{"GPIO read result to an echo call", schemas.GPIORead, func(node string) any {
			return map[string]any{"node_id": node, "pin": "pin", "level": 1, "ts_ms": now}
		}, "level"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The bogus result is valid for the tool it belongs to: only
			// the check against the called tool's schema can catch it.
			b, _ := json.Marshal(c.result(wire.NewNodeID()))
			if err := f.a.c.schemas.ValidateJSON(c.schema, b); err != nil {
				t.Fatalf("bogus result %s fails its own schema %s: %v", b, c.schema, err)
			}
			var reached atomic.Int64
			node := f.hostileDevice(DefaultTenant, func(id string, o *agent.Options) {
				o.Handlers["echo.invoke"] = func(context.Context, json.RawMessage) (any, error) {
					reached.Add(1)
					return c.result(id), nil
				}
			})
			res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoName(node), Arguments: map[string]any{"message": "hi"}})
			if err != nil {
				t.Fatalf("want an isError result, got %v", err)
			}
			e := envelope(t, res)
			if e.Code != schemas.CodeInternal || e.Category != schemas.Category(schemas.CodeInternal) {
				t.Errorf("MCP: got %s/%s (%s), want E_INTERNAL/fatal", e.Code, e.Category, e.Message)
			}
			rb, _ := json.Marshal(res)
			if strings.Contains(string(rb), c.marker) {
				t.Errorf("MCP: the bogus result reached the caller: %s", rb)
			}

			resp := f.post(t.Context(), tok, "application/json", `{"tool":"`+echoName(node)+`","arguments":{"message":"hi"}}`)
			status := resp.StatusCode
			re := restError(t, resp)
			if status != http.StatusInternalServerError || re.Code != schemas.CodeInternal {
				t.Errorf("REST: status %d, %+v; want 500 E_INTERNAL", status, re)
			}
			if n := reached.Load(); n != 2 {
				t.Errorf("the device answered %d calls, want 2 (the check is the gateway's, after the device)", n)
			}
			echoWorks(t, bystander, good)
			hostile(t, "device answers with a "+c.name, "MCP isError %s/%s %q, REST %d %s; the result (%s…) never reached the caller; bystander client lists and calls ok",
				e.Code, e.Category, e.Message, status, re.Code, c.marker)
		})
	}
}

// forgedToken is one hostile token and whether the door must accept it
// (only the control).
type forgedToken struct {
	name   string
	token  string
	accept bool
}

// forgeTokens builds, from valid claims for aud, the hostile tokens of the
// issue: alg none, HS256 keyed with the public key (raw and PEM), expired,
// not yet valid, wrong audience (wrongAud), missing tenant, no exp; and a
// control built the same way that must be accepted.
func forgeTokens(t *testing.T, dataDir, kid string, base jwt.MapClaims, wrongAud string) []forgedToken {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, auth.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	priv := k.(ed25519.PrivateKey)
	pubPEM, err := os.ReadFile(filepath.Join(dataDir, auth.PubKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auth.LoadPublicKey(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(m jwt.SigningMethod, key any, c jwt.MapClaims) string {
		tok := jwt.NewWithClaims(m, c)
		tok.Header["kid"] = kid // an attacker copies it from any real token
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatalf("sign %s: %v", m.Alg(), err)
		}
		return s
	}
	with := func(edits map[string]any) jwt.MapClaims {
		c := maps.Clone(base)
		for k, v := range edits {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	now := time.Now()
	return []forgedToken{
		{"valid (control)", sign(jwt.SigningMethodEdDSA, priv, base), true},
		{"alg none", sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, base), false},
		{"HS256 keyed with the raw Ed25519 public key", sign(jwt.SigningMethodHS256, []byte(pub), base), false},
		{"HS256 keyed with signing.pub (PEM)", sign(jwt.SigningMethodHS256, pubPEM, base), false},
		{"expired an hour ago", sign(jwt.SigningMethodEdDSA, priv, with(map[string]any{
			"exp": now.Add(-time.Hour).Unix(), "iat": now.Add(-2 * time.Hour).Unix(), "nbf": now.Add(-2 * time.Hour).Unix()})), false},
		{"not yet valid (nbf an hour ahead)", sign(jwt.SigningMethodEdDSA, priv, with(map[string]any{
			"nbf": now.Add(time.Hour).Unix()})), false},
		{"wrong aud " + wrongAud, sign(jwt.SigningMethodEdDSA, priv, with(map[string]any{"aud": []string{wrongAud}})), false},
		{"missing tenant", sign(jwt.SigningMethodEdDSA, priv, with(map[string]any{"tenant": nil})), false},
		{"no exp (unbounded lifetime)", sign(jwt.SigningMethodEdDSA, priv, with(map[string]any{"exp": nil})), false},
	}
}

func validClaims(sub, tenant, aud, scope string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"iss":    auth.Issuer,
		"sub":    sub,
		"aud":    []string{aud},
		"exp":    now.Add(time.Hour).Unix(),
		"iat":    now.Unix(),
		"nbf":    now.Add(-time.Second).Unix(),
		"jti":    strings.ToLower(wire.NewMsgID()),
		"tenant": tenant,
		"scope":  scope,
	}
}

// tierAuth authenticates at the tier with token, in an auth frame or in
// the upgrade's Authorization header, and returns "auth_ok" or the close
// code, with the codes of the error frames before it.
func tierAuth(t *testing.T, url, token string, header bool) (string, []string) {
	t.Helper()
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	o := &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}}
	if header {
		o.HTTPHeader = http.Header{"Authorization": {"Bearer " + token}}
	}
	c, resp, err := websocket.Dial(ctx, url, o)
	if err != nil {
		t.Fatalf("dial tier: %v", err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	defer c.CloseNow()
	var codes []string
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			code := websocket.CloseStatus(err)
			if code == -1 {
				t.Fatalf("read: %v, want a close", err)
			}
			return fmt.Sprint(int(code)), codes
		}
		e, err := wire.DecodeEnvelope(set, b)
		if err != nil {
			t.Fatalf("tier sent %s: %v", b, err)
		}
		switch e.Type {
		case wire.TypeHello:
			if !header {
				f, _ := wire.Encode(wire.TypeAuth, "", wire.Auth{Token: token})
				if err := c.Write(ctx, websocket.MessageText, f); err != nil {
					t.Fatalf("write auth: %v", err)
				}
			}
		case wire.TypeError:
			var f wire.ErrorFrame
			_ = wire.DecodePayload(e, &f)
			codes = append(codes, f.Code)
		case wire.TypeAuthOK:
			return e.Type, codes
		default:
			t.Fatalf("tier sent %s before auth_ok", b)
		}
	}
}

// TestHostileTokens: forged, expired, not-yet-valid, wrong-audience and
// tenant-less tokens get 401 with WWW-Authenticate Bearer resource_metadata
// at the gateway's doors (/mcp and /mcp/tools/call), and 4401 (after an
// E_SAFETY_DENIED error frame) at the tier, in an auth frame or the
// upgrade's header; the same construction, unaltered, is accepted, and a
// bystander client and device keep working.
func TestHostileTokens(t *testing.T) {
	var dataDir string
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { dataDir = c.DataDir })
	node := f.hostileDevice(DefaultTenant, unlimitedEcho)
	bystander := f.client(f.token(auth.MintOptions{Subject: "bystander"}), "")
	echoWorks(t, bystander, node)

	mcpURL := f.a.MCPURL()
	callURL := strings.TrimSuffix(mcpURL, "/mcp") + "/mcp/tools/call"
	doors := []struct{ name, url, body, accept string }{
		{"POST /mcp", mcpURL, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "application/json, text/event-stream"},
		{"POST /mcp/tools/call", callURL, `{"tool":"` + echoName(node) + `","arguments":{"message":"hi"}}`, "application/json"},
	}
	agent := forgeTokens(t, dataDir, f.a.Signer().KeyID(), validClaims("agent-1", DefaultTenant, auth.AudienceGateway, auth.ScopeReadOnly), auth.AudienceDevice)
	for _, tc := range agent {
		t.Run("gateway "+tc.name, func(t *testing.T) {
			var seen []string
			for _, d := range doors {
				req, _ := http.NewRequestWithContext(t.Context(), "POST", d.url, strings.NewReader(d.body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", d.accept)
				req.Header.Set("Authorization", "Bearer "+tc.token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				h := resp.Header.Get("WWW-Authenticate")
				seen = append(seen, fmt.Sprintf("%s %d", d.name, resp.StatusCode))
				if tc.accept {
					if resp.StatusCode != http.StatusOK {
						t.Errorf("%s: control token got %d, want 200", d.name, resp.StatusCode)
					}
					continue
				}
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s: status %d, want 401", d.name, resp.StatusCode)
				}
				want := `resource_metadata="` + strings.TrimSuffix(mcpURL, "/mcp") + `/.well-known/oauth-protected-resource/mcp"`
				if !strings.HasPrefix(h, "Bearer ") || !strings.Contains(h, want) {
					t.Errorf("%s: WWW-Authenticate %q, want Bearer with %s", d.name, h, want)
				}
			}
			echoWorks(t, bystander, node)
			hostile(t, "agent token: "+tc.name, "%s; WWW-Authenticate Bearer resource_metadata=…/.well-known/oauth-protected-resource/mcp; bystander client ok",
				strings.Join(seen, ", "))
		})
	}

	devNode := wire.NewNodeID()
	devTokens := forgeTokens(t, dataDir, f.a.Signer().KeyID(), validClaims(devNode, DefaultTenant, auth.AudienceDevice, auth.ScopeDeviceConnect), auth.AudienceGateway)
	for _, tc := range devTokens {
		t.Run("tier "+tc.name, func(t *testing.T) {
			var seen []string
			for _, header := range []bool{false, true} {
				how := "auth frame"
				if header {
					how = "bearer header"
				}
				got, codes := tierAuth(t, f.a.DeviceURL(), tc.token, header)
				seen = append(seen, fmt.Sprintf("%s: %s %v", how, got, codes))
				switch {
				case tc.accept && got != wire.TypeAuthOK:
					t.Errorf("%s: control token got %s %v, want auth_ok", how, got, codes)
				case !tc.accept && (got != "4401" || len(codes) != 1 || codes[0] != schemas.CodeSafetyDenied):
					t.Errorf("%s: got %s after error frames %v, want one E_SAFETY_DENIED then 4401", how, got, codes)
				}
			}
			echoWorks(t, bystander, node)
			hostile(t, "device token: "+tc.name, "%s; bystander device and client ok", strings.Join(seen, "; "))
		})
	}
}

// TestHostileCrossTenant: a tenant-B device's tools never appear in tenant
// A's tools/list, even for a token with every call scope; each call of A
// to one of them is E_SAFETY_DENIED over MCP and 403 E_SAFETY_DENIED over
// the REST/SSE door, and never reaches the device; B's own client and A's
// own device are unaffected.
func TestHostileCrossTenant(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	var reachedB atomic.Int64
	nodeA := f.hostileDevice(DefaultTenant, nil)
	nodeB := f.hostileDevice(tenantB, func(_ string, o *agent.Options) { countInvocations(o, &reachedB) })
	all := []string{auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive}
	tokA := f.token(auth.MintOptions{Scopes: all})
	a := f.client(tokA, "")
	b := f.client(f.token(auth.MintOptions{Tenant: tenantB, Scopes: all}), "")

	list, err := a.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var listedA int
	for _, tl := range list.Tools {
		if strings.Contains(tl.Name, nodeB) {
			t.Errorf("tenant %s lists %s of tenant %s", DefaultTenant, tl.Name, tenantB)
		}
		if strings.Contains(tl.Name, nodeA) {
			listedA++
		}
	}
	if listedA != 5 {
		t.Errorf("tenant %s lists %d tools of its own node, want 5", DefaultTenant, listedA)
	}

	toolsB := []struct {
		name string
		args map[string]any
	}{
		{echoName(nodeB), map[string]any{"message": "hi"}},
		{"sys." + nodeB + ".metrics.snapshot", map[string]any{}},
		{"sys." + nodeB + ".metrics.subscribe", map[string]any{"interval_ms": 1000}},
		{"gpio." + nodeB + ".pin.read", map[string]any{}},
		{"gpio." + nodeB + ".pin.write", map[string]any{"level": 1}},
	}
	var observed []string
	for _, tl := range toolsB {
		p := &sdk.CallToolParams{Name: tl.name, Arguments: tl.args}
		p.SetProgressToken("x") // for the subscribe
		res, err := a.CallTool(t.Context(), p)
		if err != nil {
			t.Errorf("MCP %s: %v, want an isError result", tl.name, err)
			continue
		}
		e := envelope(t, res)
		if e.Code != schemas.CodeSafetyDenied {
			t.Errorf("MCP %s: %s, want E_SAFETY_DENIED", tl.name, e.Code)
		}
		observed = append(observed, "MCP "+strings.Replace(tl.name, nodeB, "B", 1)+" "+e.Code)
	}
	sse := f.post(t.Context(), tokA, "text/event-stream", subscribeBody(nodeB, `{"interval_ms":1000}`))
	sseStatus := sse.StatusCode
	if e := restError(t, sse); sseStatus != http.StatusForbidden || e.Code != schemas.CodeSafetyDenied {
		t.Errorf("SSE subscribe of B: status %d, %+v; want 403 E_SAFETY_DENIED", sseStatus, e)
	}
	rest := f.post(t.Context(), tokA, "application/json", `{"tool":"`+echoName(nodeB)+`","arguments":{"message":"hi"}}`)
	restStatus := rest.StatusCode
	if e := restError(t, rest); restStatus != http.StatusForbidden || e.Code != schemas.CodeSafetyDenied {
		t.Errorf("REST echo of B: status %d, %+v; want 403 E_SAFETY_DENIED", restStatus, e)
	}
	if n := reachedB.Load(); n != 0 {
		t.Errorf("tenant %s's calls reached the tenant-%s device %d times", DefaultTenant, tenantB, n)
	}

	// B sees its own tools, not A's, and calls them; A calls its own.
	listB, err := b.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range listB.Tools {
		if strings.Contains(tl.Name, nodeA) {
			t.Errorf("tenant %s lists %s of tenant %s", tenantB, tl.Name, DefaultTenant)
		}
	}
	echoWorks(t, b, nodeB)
	echoWorks(t, a, nodeA)
	hostile(t, "cross-tenant listing and calls (token with every call scope)",
		"A lists %d tools of its node and none of B's (B lists %d, none of A's); %s; SSE subscribe %d E_SAFETY_DENIED; REST echo %d E_SAFETY_DENIED; B's device reached 0 times; B's client and A's device ok",
		listedA, len(listB.Tools), strings.Join(observed, ", "), sseStatus, restStatus)
}

// sseOpen is one SSE response and its first event.
type sseOpen struct {
	resp   *http.Response
	cancel context.CancelFunc
	first  event
	err    error
}

// openSSE posts one subscribe and reads its first event; a stream that
// says nothing within 10 s is an error.
func openSSE(ctx context.Context, client *http.Client, url, token, body string) sseOpen {
	ctx, cancel := context.WithCancel(ctx)
	o := sseOpen{cancel: cancel}
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	watchdog := time.AfterFunc(10*time.Second, cancel)
	defer watchdog.Stop()
	resp, err := client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	o.resp = resp
	if resp.StatusCode != http.StatusOK {
		o.err = fmt.Errorf("status %d", resp.StatusCode)
		return o
	}
	sc := bufio.NewReader(resp.Body)
	for {
		line, err := sc.ReadString('\n')
		if err != nil {
			o.err = fmt.Errorf("stream ended before its first event: %w", err)
			return o
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "event: "):
			o.first.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			o.first.data = line[len("data: "):]
		case line == "":
			return o
		}
	}
}

// close ends the stream from the client's side.
func (o *sseOpen) close() {
	o.cancel()
	if o.resp != nil {
		_, _ = io.Copy(io.Discard, o.resp.Body)
		o.resp.Body.Close()
	}
}

// TestHostileIdleSSEStreams: one client of a tenant opens 1,000 idle SSE
// streams on one device's metrics subscribe (interval 60 s) at a gateway
// that allows 256 per tenant: exactly 256 open, the other 744 get
// close 4429 rate_limited at once; a client of another tenant can still
// open a stream and call tools; once the client closes them all, nothing
// is left open on the gateway, the tier or the device.
func TestHostileIdleSSEStreams(t *testing.T) {
	const (
		streams  = 1000
		quota    = 256
		parallel = 64
	)
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.MaxStreamsPerTenant = quota })
	var deviceStreams atomic.Int64 // stream handlers running on the device
	unlimited := func(id string, o *agent.Options) {
		// The capability's own limits (max_concurrency 8, 10 rps) would
		// refuse most streams at the tier: lift them, so that the gateway's
		// tenant quota is what is tested.
		for i := range o.Capabilities {
			if o.Capabilities[i].CapID == "metrics" {
				o.Capabilities[i].Constraints = schemas.Constraints{DeadlineMsDefault: 2000}
			}
		}
		h := o.Streams["metrics.subscribe"]
		o.Streams["metrics.subscribe"] = func(ctx context.Context, args json.RawMessage, emit func(any) error) error {
			deviceStreams.Add(1)
			defer deviceStreams.Add(-1)
			return h(ctx, args, emit)
		}
	}
	node := f.hostileDevice(DefaultTenant, unlimited)
	nodeB := f.hostileDevice(tenantB, unlimited)
	tr := &http.Transport{MaxIdleConns: streams, MaxIdleConnsPerHost: streams, MaxConnsPerHost: 0}
	t.Cleanup(tr.CloseIdleConnections) // before the fixture stops
	client := &http.Client{Transport: tr}
	url := strings.TrimSuffix(f.a.MCPURL(), "/mcp") + "/mcp/tools/call"
	tok := f.token(auth.MintOptions{})
	body := subscribeBody(node, `{"interval_ms":60000}`)

	start := time.Now()
	opens := make([]sseOpen, streams)
	next := make(chan int)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for i := range next {
				opens[i] = openSSE(t.Context(), client, url, tok, body)
			}
		})
	}
	for i := range streams {
		next <- i
	}
	close(next)
	wg.Wait()
	openTime := time.Since(start)
	defer func() {
		for i := range opens {
			opens[i].close()
		}
	}()

	var open, limited, other int
	const want4429 = `{"code":4429,"reason":"rate_limited"}`
	for i := range opens {
		o := &opens[i]
		switch {
		case o.err != nil:
			other++
			if other <= 5 {
				t.Errorf("stream %d: %v", i, o.err)
			}
		case o.first.name == "metric":
			open++
		case o.first.name == "close" && o.first.data == want4429:
			limited++
			// Its response ends right after the close event.
			if n, err := io.Copy(io.Discard, o.resp.Body); err != nil || n != 0 {
				t.Errorf("stream %d: %d more bytes (%v) after close 4429", i, n, err)
			}
		default:
			other++
			if other <= 5 {
				t.Errorf("stream %d: first event %+v, want a metric or close 4429", i, o.first)
			}
		}
	}
	if open != quota || limited != streams-quota {
		t.Errorf("%d streams open, %d closed 4429, %d other; want %d, %d, 0", open, limited, other, quota, streams-quota)
	}
	heldGW, heldTier, heldDevice := f.a.gw.gw.Streams().Open(), f.a.tier.tier.Streams(), deviceStreams.Load()
	if heldGW != quota || heldTier != quota || heldDevice != quota {
		t.Errorf("gateway, tier and device hold %d, %d, %d streams; want %d each", heldGW, heldTier, heldDevice, quota)
	}

	// Meanwhile, another tenant streams and calls.
	bTok := f.token(auth.MintOptions{Tenant: tenantB})
	bStream := openSSE(t.Context(), client, url, bTok, subscribeBody(nodeB, `{"interval_ms":60000}`))
	if bStream.err != nil || bStream.first.name != "metric" {
		t.Errorf("tenant %s stream: %+v, %v; want a metric", tenantB, bStream.first, bStream.err)
	}
	echoWorks(t, f.client(bTok, ""), nodeB)
	// And tenant A can still call (only streams are at quota).
	echoWorks(t, f.client(tok, ""), node)
	bStream.close()

	closeStart := time.Now()
	for i := range opens {
		opens[i].close()
	}
	eventually(t, "gateway streams closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })
	eventually(t, "tier streams closed", func() bool { return f.a.tier.tier.Streams() == 0 })
	eventually(t, "device streams stopped", func() bool { return deviceStreams.Load() == 0 })
	closeTime := time.Since(closeStart)

	// The quota is free again.
	again := openSSE(t.Context(), client, url, tok, body)
	if again.err != nil || again.first.name != "metric" {
		t.Errorf("stream after the others closed: %+v, %v; want a metric", again.first, again.err)
	}
	again.close()
	eventually(t, "last stream closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })
	hostile(t, "one client holding 1,000 idle SSE streams (quota 256 per tenant)",
		"%d open (first event metric), %d got event close %s at once, %d other, in %v; gateway/tier/device held %d/%d/%d; other tenant streamed and called ok; all closed in %v (gateway, tier, device back to 0); quota free again",
		open, limited, want4429, other, openTime.Round(time.Millisecond), heldGW, heldTier, heldDevice, closeTime.Round(time.Millisecond))
}

// TestMetadataURLFollowsHost: a 401's resource_metadata names the host the
// client addressed, whichever it is and however often it alternates.
func TestMetadataURLFollowsHost(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	u, err := url.Parse(f.a.MCPURL())
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(u.Host)
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port, "127.0.0.1:" + port} {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", f.a.MCPURL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := `resource_metadata="http://` + host + `/.well-known/oauth-protected-resource/mcp"`
		if h := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(h, want) {
			t.Errorf("Host %s: %d, WWW-Authenticate %q; want 401 with %s", host, resp.StatusCode, h, want)
		}
	}
}
