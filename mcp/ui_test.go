package mcp

import (
	"bufio"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// dashboardTest is a gateway serving the dashboard over HTTP, on an
// embedded NATS server with okso's credentials: the gateway connects as
// the gateway role, and pub publishes as a device tier does.
type dashboardTest struct {
	g      *Gateway
	srv    *httptest.Server
	pub    *nats.Conn
	signer *auth.Signer
	reg    *prometheus.Registry
}

func newDashboardTest(t *testing.T) *dashboardTest {
	t.Helper()
	return newDashboardTestWith(t, Options{PingInterval: time.Hour})
}

// newDashboardTestWith is newDashboardTest with the gateway's options o
// (NATS, registry, schemas, verifier and metrics are the test's).
func newDashboardTestWith(t *testing.T, o Options) *dashboardTest {
	t.Helper()
	creds, err := bus.NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := bus.StartServer(bus.ServerOptions{Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := ns.ConnectAs(bus.RoleGateway, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := ns.ConnectAs(bus.RoleDevice, "tier")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	signer, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o.NC, o.Registry, o.Schemas, o.Metrics = nc, &bus.Registry{}, set, reg
	o.Verifier = auth.NewVerifier(signer.Public(), auth.AudienceGateway)
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return &dashboardTest{g: g, srv: srv, pub: pub, signer: signer, reg: reg}
}

func (d *dashboardTest) token(t *testing.T, tenant string, scopes ...string) string {
	t.Helper()
	tok, err := d.signer.Mint(auth.MintOptions{Subject: "agent-" + tenant, Tenant: tenant, Scopes: scopes})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (d *dashboardTest) post(t *testing.T, path, token string, h map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, d.srv.URL+path, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	res, err := d.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// TestDashboardHeaders: every /ui/ answer, files and API alike, carries
// the strict policy; the files need no token; / leads to the dashboard.
func TestDashboardHeaders(t *testing.T) {
	d := newDashboardTest(t)
	want := map[string]string{
		"Content-Security-Policy": uiPolicy,
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
		"X-Frame-Options":         "DENY",
	}
	for _, c := range []struct{ path, ctype string }{
		{"/ui/", "text/html"},
		{"/ui/app.js", "text/javascript"},
		{"/ui/api.js", "text/javascript"},
		{"/ui/style.css", "text/css"},
	} {
		res, err := d.srv.Client().Get(d.srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), c.ctype) {
			t.Errorf("GET %s: %d %s, want 200 %s", c.path, res.StatusCode, res.Header.Get("Content-Type"), c.ctype)
		}
		for k, v := range want {
			if got := res.Header.Get(k); got != v {
				t.Errorf("GET %s: %s %q, want %q", c.path, k, got, v)
			}
		}
	}
	for _, p := range []string{"/ui/api/whoami", "/ui/api/audit"} {
		res := d.post(t, p, "", nil)
		if res.Header.Get("Content-Security-Policy") != uiPolicy || res.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("POST %s: headers %v", p, res.Header)
		}
	}
	if !strings.Contains(uiPolicy, "default-src 'none'") || !strings.Contains(uiPolicy, "frame-ancestors 'none'") ||
		strings.Contains(uiPolicy, "unsafe") {
		t.Errorf("policy %q is not strict", uiPolicy)
	}
	client := *d.srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, p := range []string{"/", "/ui"} {
		res, err := client.Get(d.srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/ui/" {
			t.Errorf("GET %s: %d to %q, want 302 to /ui/", p, res.StatusCode, res.Header.Get("Location"))
		}
	}
}

// TestDashboardAPIAuth: the API takes the agents' token and nothing
// else, answers a refusal as /mcp does, and refuses a cross-origin
// browser request.
func TestDashboardAPIAuth(t *testing.T) {
	d := newDashboardTest(t)
	for _, tok := range []string{"", "not-a-token", d.token(t, "demo", auth.ScopeReadOnly)[:40]} {
		res := d.post(t, "/ui/api/whoami", tok, nil)
		if res.StatusCode != http.StatusUnauthorized || !strings.Contains(res.Header.Get("WWW-Authenticate"), "resource_metadata=") {
			t.Errorf("token %q: %d %q, want 401 with resource_metadata", tok, res.StatusCode, res.Header.Get("WWW-Authenticate"))
		}
	}
	tok := d.token(t, "demo", auth.ScopeReadOnly)
	res := d.post(t, "/ui/api/whoami", tok, nil)
	var who whoami
	if err := json.NewDecoder(res.Body).Decode(&who); err != nil || res.StatusCode != http.StatusOK ||
		who.Tenant != "demo" || who.Subject != "agent-demo" || !who.AuditFeed {
		t.Fatalf("whoami: %d %+v %v", res.StatusCode, who, err)
	}
	res = d.post(t, "/ui/api/whoami", tok, map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("a cross-origin request: %d, want 403", res.StatusCode)
	}
	// The audit feed needs a call scope; a stream needs its Accept.
	if res := d.post(t, "/ui/api/audit", d.token(t, "demo"), map[string]string{"Accept": "text/event-stream"}); res.StatusCode != http.StatusForbidden {
		t.Errorf("audit feed without a scope: %d, want 403", res.StatusCode)
	}
	if res := d.post(t, "/ui/api/audit", tok, nil); res.StatusCode != http.StatusNotAcceptable {
		t.Errorf("audit feed without Accept: text/event-stream: %d, want 406", res.StatusCode)
	}
}

// feedEvent is one event of a feed.
type feedEvent struct{ name, data string }

// readFeed sends each event of body on the returned channel until the
// body ends.
func readFeed(body io.Reader) <-chan feedEvent {
	ch := make(chan feedEvent, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		var ev feedEvent
		for sc.Scan() {
			switch l := sc.Text(); {
			case strings.HasPrefix(l, "event: "):
				ev.name = l[len("event: "):]
			case strings.HasPrefix(l, "data: "):
				ev.data = l[len("data: "):]
			case l == "":
				ch <- ev
				ev = feedEvent{}
			}
		}
	}()
	return ch
}

func nextFeed(t *testing.T, ch <-chan feedEvent) feedEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the feed ended")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10 s")
	}
	return feedEvent{}
}

// TestDashboardAuditFeed: a feed gets its own tenant's events, and
// never another tenant's, one forged onto its subject, or one that
// JetStream reflected; it ends when the gateway stops.
func TestDashboardAuditFeed(t *testing.T) {
	d := newDashboardTest(t)
	res := d.post(t, "/ui/api/audit", d.token(t, "demo", auth.ScopeReadOnly), map[string]string{"Accept": "text/event-stream"})
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("audit feed: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	events := readFeed(res.Body)
	if ev := nextFeed(t, events); ev.name != "ready" || ev.data != `{"tenant":"demo"}` {
		t.Fatalf("first event %+v, want ready for demo", ev)
	}
	publish := func(subject string, e bus.AuditEvent, h nats.Header) {
		t.Helper()
		b, _ := json.Marshal(e)
		if err := d.pub.PublishMsg(&nats.Msg{Subject: subject, Data: b, Header: h}); err != nil {
			t.Fatal(err)
		}
	}
	publish(bus.Audit("demo"), bus.AuditEvent{Actor: "tier", Tenant: "demo", Decision: bus.DecisionAllowed, Tool: "first"}, nil)
	publish(bus.Audit("other"), bus.AuditEvent{Actor: "tier", Tenant: "other", Decision: bus.DecisionAllowed, Tool: "other's"}, nil)
	publish(bus.Audit("demo"), bus.AuditEvent{Actor: "tier", Tenant: "other", Decision: bus.DecisionAllowed, Tool: "forged"}, nil)
	publish(bus.Audit("demo"), bus.AuditEvent{Actor: "tier", Tenant: "demo", Decision: bus.DecisionAllowed, Tool: "reflected"},
		nats.Header{jetstream.StreamHeader: {bus.StreamAudit}})
	publish(bus.Audit("demo"), bus.AuditEvent{Actor: "tier", Tenant: "demo", Decision: bus.DecisionDenied, Tool: "last <img src=x>"}, nil)
	for _, want := range []string{"first", "last <img src=x>"} {
		ev := nextFeed(t, events)
		var e bus.AuditEvent
		if ev.name != "audit" || json.Unmarshal([]byte(ev.data), &e) != nil || e.Tool != want || e.Tenant != "demo" {
			t.Fatalf("event %+v, want the audit event of tool %q (events from one publisher keep their order)", ev, want)
		}
		if strings.Contains(ev.data, "<") {
			t.Errorf("event data %s carries markup unescaped", ev.data)
		}
	}
	if n := metricValue(t, d.reg, "okso_gateway_audit_feeds"); n != 1 {
		t.Errorf("okso_gateway_audit_feeds %v with one feed open", n)
	}
	d.g.EndStreams()
	if ev := nextFeed(t, events); ev.name != "close" {
		t.Fatalf("after EndStreams: %+v, want close", ev)
	}
	if _, ok := <-events; ok {
		t.Fatal("the feed goes on after its close event")
	}
}

// TestDashboardAuditFeedBounds: a feed pings while idle, and holds one
// of its tenant's stream slots, so a tenant at its bound is refused one
// more (429) while another tenant is not.
func TestDashboardAuditFeedBounds(t *testing.T) {
	d := newDashboardTestWith(t, Options{PingInterval: 20 * time.Millisecond, MaxStreamsPerTenant: 1})
	sse := map[string]string{"Accept": "text/event-stream"}
	res := d.post(t, "/ui/api/audit", d.token(t, "demo", auth.ScopeReadOnly), sse)
	events := readFeed(res.Body)
	if ev := nextFeed(t, events); ev.name != "ready" {
		t.Fatalf("first event %+v, want ready", ev)
	}
	if ev := nextFeed(t, events); ev.name != "ping" {
		t.Fatalf("an idle feed's next event %+v, want ping", ev)
	}
	if res := d.post(t, "/ui/api/audit", d.token(t, "demo", auth.ScopeReadOnly), sse); res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a second feed of a tenant at its bound: %d, want 429", res.StatusCode)
	}
	other := d.post(t, "/ui/api/audit", d.token(t, "other", auth.ScopeReadOnly), sse)
	if other.StatusCode != http.StatusOK {
		t.Errorf("another tenant's feed: %d, want 200", other.StatusCode)
	}
	d.g.EndStreams()
	for range events { // to its end
	}
}

// htmlSinks are what the dashboard's scripts must never use: each
// parses or runs a string.
var htmlSinks = regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\s*\(|new\s+Function|` +
	`setTimeout\(\s*['"` + "`" + `]|setInterval\(\s*['"` + "`" + `]|srcdoc|javascript:|createContextualFragment|DOMParser|\.html\(`)

// inlineHTML is what the dashboard's pages must never hold: inline
// script, event handler attributes, inline style (the policy refuses
// them; the test says where).
var inlineHTML = regexp.MustCompile(`(?i)<script(\s[^>]*)?>\s*[^<\s]|<script(?:(?:\s(?:type|lang)="[^"]*")*)\s*>|\son[a-z]+\s*=|\sstyle\s*=|javascript:`)

// sinks returns what in the file named name breaks the rules above.
func sinks(name string, text string) []string {
	re := htmlSinks
	if strings.HasSuffix(name, ".html") {
		re = inlineHTML
	} else if !strings.HasSuffix(name, ".js") {
		return nil
	}
	return re.FindAllString(text, -1)
}

// TestDashboardNoHTMLSinks: the embedded scripts make elements and text
// nodes only, and the page has no inline script, handler or style. The
// checker itself catches each kind of sink.
func TestDashboardNoHTMLSinks(t *testing.T) {
	for _, bad := range []struct{ name, text string }{
		{"x.js", "row.innerHTML = name"},
		{"x.js", "el.insertAdjacentHTML('beforeend', s)"},
		{"x.js", "document.write(s)"},
		{"x.js", "setTimeout('go()', 1)"},
		{"x.js", "new Function('return 1')"},
		{"x.html", `<script>alert(1)</script>`},
		{"x.html", `<script type="module">go()</script>`},
		{"x.html", `<button onclick="go()">`},
		{"x.html", `<p style="color:red">`},
	} {
		if len(sinks(bad.name, bad.text)) == 0 {
			t.Errorf("the checker misses %q in %s", bad.text, bad.name)
		}
	}
	if len(sinks("x.html", `<script type="module" src="app.js"></script>`)) != 0 {
		t.Error("the checker refuses a script by its src")
	}
	n := 0
	err := fs.WalkDir(uiFiles, "ui", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := fs.ReadFile(uiFiles, path)
		if err != nil {
			return err
		}
		n++
		if found := sinks(path, string(b)); len(found) > 0 {
			t.Errorf("%s uses %q", path, found)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 4 {
		t.Fatalf("checked %d files of the dashboard, want its page, style and scripts", n)
	}
}

// metricValue is the value of the one gauge or counter name of reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.Metric) == 1 {
			if g := f.Metric[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return f.Metric[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
