package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/bearer"
)

// updateScreenshot writes the dashboard's screenshot of TestUIDashboard
// to docs/dashboard.png, the README's picture.
var updateScreenshot = flag.Bool("update-screenshot", false, "write TestUIDashboard's screenshot to docs/dashboard.png")

// hostileDescription is the description of a caller tool that tries to
// run script in the dashboard, in each way a page that parsed it as
// HTML would run.
const hostileDescription = `<img src=x onerror="window.__pwned='img'"><script>window.__pwned='script'</script>` +
	`<svg onload="window.__pwned='svg'"></svg>`

// chromiumPath is the browser the dashboard test drives: $OKSO_CHROMIUM,
// else Debian's chromium (.ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("OKSO_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no Chromium for the dashboard test (%v): apt-get install chromium (make interop-deps does), or set OKSO_CHROMIUM", err)
	}
	return p
}

// uiResult is what ui.mjs saw.
type uiResult struct {
	CSP               string   `json:"csp"`
	Refused           string   `json:"refused"`
	RefusedDashHidden bool     `json:"refusedDashHidden"`
	RefusedStored     *string  `json:"refusedStored"`
	Stored            bool     `json:"stored"`
	TokenInPage       bool     `json:"tokenInPage"`
	TokenInURL        []string `json:"tokenInURL"`
	Who               string   `json:"who"`
	Nodes             []string `json:"nodes"`
	Presence          []string `json:"presence"`
	Samples           int      `json:"samples"`
	CallTool          string   `json:"callTool"`
	Echo              struct {
		Message string `json:"message"`
		NodeID  string `json:"node_id"`
	} `json:"echo"`
	RefusedCall struct {
		Code, Category, Message string
	} `json:"refusedCall"`
	EchoRequestID  string      `json:"echoRequestID"`
	AuditRow       string      `json:"auditRow"`
	FleetRows      [][2]string `json:"fleetRows"`
	FleetStatus    string      `json:"fleetStatus"`
	HostileListed  string      `json:"hostileListed"`
	HostileDesc    string      `json:"hostileDesc"`
	UpstreamListed string      `json:"upstreamListed"`
	HostileElems   int         `json:"hostileElements"`
	Pwned          any         `json:"pwned"`
	PwnedAtEnd     any         `json:"pwnedAtEnd"`
	AfterSignOut   *string     `json:"afterSignOut"`
	BigRequests    []struct {
		Labels map[string]string `json:"labels"`
		Limit  int               `json:"limit"`
		Cursor string            `json:"cursor"`
	} `json:"bigRequests"`
	BigPage       string   `json:"bigPage"`
	BigRows       int      `json:"bigRows"`
	BigOffline    []string `json:"bigOffline"`
	BigTotal      string   `json:"bigTotal"`
	PageErrors    []string `json:"pageErrors"`
	ConsoleErrors []string `json:"consoleErrors"`
	Dialogs       []string `json:"dialogs"`
}

// TestUIDashboard drives the dashboard in headless Chromium against a
// real all-in-one with three mock devices and, as another agent of the
// tenant, a caller tool whose description is markup: every item of
// issue 33's list. Screenshots are the test's artefacts (go test
// -artifacts keeps them); -update-screenshot refreshes the README's.
func TestUIDashboard(t *testing.T) {
	o := startOkso(t, 3, "--remotes", hostileUpstream(t))
	browser := chromiumPath(t)
	hostile := o.listenHostile(t)
	o.waitTools(t, o.token, "shady.lookup")

	artefacts := t.ArtifactDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ui := strings.TrimSuffix(o.mcpURL, "/mcp") + "/ui/"
	cmd := nodeCommand(ctx, t, []string{"OKSO_UI=" + ui, "OKSO_TOKEN=" + o.token, "OKSO_CHROMIUM=" + browser,
		"OKSO_ARTEFACTS=" + artefacts, "OKSO_HOSTILE_TOOL=" + hostile, "OKSO_HOSTILE_UPSTREAM=" + listedName("shady.lookup")},
		"ui.mjs")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("node ui.mjs: %v\nstderr:\n%s\nstdout:\n%s\nokso log:\n%s", err, clip(errOut.Bytes()), clip(out.Bytes()), o.stderr)
	}
	var r uiResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("ui.mjs printed no JSON (%v):\n%s", err, clip(out.Bytes()))
	}
	t.Logf("screenshots in %s", artefacts)

	// Safe by construction: the policy, the token kept out of URLs and
	// the page, and no error, dialog or script run.
	for _, p := range []string{"default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "require-trusted-types-for 'script'"} {
		if !strings.Contains(r.CSP, p) {
			t.Errorf("the page's CSP %q has no %s", r.CSP, p)
		}
	}
	if len(r.TokenInURL) > 0 || r.TokenInPage {
		t.Errorf("the token is in a URL %v or in the page's markup (%v)", r.TokenInURL, r.TokenInPage)
	}
	// Chromium logs the spoiled token's 401 and the unknown tool's 404 as
	// failed loads: those are expected; any other (a policy violation
	// says "Refused to") is not.
	consoleErrors := slices.DeleteFunc(r.ConsoleErrors, func(e string) bool {
		return strings.Contains(e, "status of 401") || strings.Contains(e, "status of 404")
	})
	if len(r.PageErrors) > 0 || len(consoleErrors) > 0 || len(r.Dialogs) > 0 {
		t.Errorf("page errors %q, console errors %q, dialogs %q", r.PageErrors, consoleErrors, r.Dialogs)
	}

	// A wrong token is refused, with the gateway's reason, and not kept.
	if !strings.Contains(r.Refused, "invalid token") || !r.RefusedDashHidden || r.RefusedStored != nil {
		t.Errorf("a spoiled token: %q, dashboard hidden %v, kept %v", r.Refused, r.RefusedDashHidden, r.RefusedStored)
	}
	// The right one is kept in session storage until sign-out.
	if !r.Stored || !strings.Contains(r.Who, "tenant "+tenant) || r.AfterSignOut != nil {
		t.Errorf("signed in: kept %v, %q; after sign-out %v", r.Stored, r.Who, r.AfterSignOut)
	}
	// The mock nodes, online.
	got := slices.Sorted(slices.Values(r.Nodes))
	if !slices.Equal(got, o.nodes) || slices.ContainsFunc(r.Presence, func(p string) bool { return !strings.Contains(p, "online") }) {
		t.Errorf("nodes %v (%q), want %v online", got, r.Presence, o.nodes)
	}
	if r.Samples < 2 {
		t.Errorf("the chart got %d samples, want at least 2", r.Samples)
	}
	// sysecho's echo, and the call in the audit feed and on NATS.
	if r.Echo.Message != "hello from chromium" || !slices.Contains(o.nodes, r.Echo.NodeID) || !strings.HasPrefix(r.CallTool, "sysecho") {
		t.Errorf("called %s: echo %+v", r.CallTool, r.Echo)
	}
	if r.EchoRequestID == "" || !strings.Contains(r.AuditRow, r.EchoRequestID) || !strings.Contains(r.AuditRow, "allowed") {
		t.Errorf("the call %q in the audit feed: row %q", r.EchoRequestID, r.AuditRow)
	}
	if _, ok := o.audit.wait(10*time.Second, func(e bus.AuditEvent) bool {
		return e.RequestID == r.EchoRequestID && e.Actor == "gateway" && e.Decision == bus.DecisionAllowed && strings.HasPrefix(e.Tool, "sysecho.")
	}); !ok {
		t.Errorf("no audit event on NATS for the page's call %s", r.EchoRequestID)
	}
	// A refused call shows its error envelope.
	if r.RefusedCall.Code != "E_TOOL_NOT_FOUND" || r.RefusedCall.Category != "tool_not_found" || r.RefusedCall.Message == "" {
		t.Errorf("a call of an unknown tool shows %+v, want its E_TOOL_NOT_FOUND envelope", r.RefusedCall)
	}
	// fleet.call: a row per node, each ok.
	if len(r.FleetRows) != len(o.nodes) || slices.ContainsFunc(r.FleetRows, func(row [2]string) bool { return row[1] != "ok" }) {
		t.Errorf("fleet.call rows %v (%s), want %d ok", r.FleetRows, r.FleetStatus, len(o.nodes))
	}
	// The markup is text: shown literally, no element made, nothing run.
	if !strings.Contains(r.HostileListed, hostileDescription) || !strings.Contains(r.HostileDesc, hostileDescription) {
		t.Errorf("the hostile description is not shown as its text: listed %q, described %q", r.HostileListed, r.HostileDesc)
	}
	if !strings.Contains(r.UpstreamListed, hostileDescription) || !strings.Contains(r.UpstreamListed, "upstream shady") {
		t.Errorf("the upstream's hostile description is not shown as its text, under its upstream: %q", r.UpstreamListed)
	}
	if r.HostileElems != 0 || r.Pwned != nil || r.PwnedAtEnd != nil {
		t.Errorf("the hostile description ran: %d elements made, window.__pwned %v, %v", r.HostileElems, r.Pwned, r.PwnedAtEnd)
	}

	// 10,000 nodes: one page of rows, the rest by search and cursor.
	if r.BigRows != 50 || !strings.HasPrefix(r.BigPage, "51–100 of 10000") || r.BigTotal != "(10000)" || len(r.BigOffline) != 10 {
		t.Errorf("a fleet of 10,000: %d rows, page %q, total %q, %d offline shown; want 50 rows, 51–100 of 10000, 10 offline",
			r.BigRows, r.BigPage, r.BigTotal, len(r.BigOffline))
	}
	for _, seen := range r.BigOffline {
		if !strings.Contains(seen, "ago") {
			t.Errorf("an offline node's last seen %q", seen)
		}
	}
	paged := false
	for _, a := range r.BigRequests {
		if a.Limit > 100 || a.Cursor != "" && a.Labels["zone"] != "b" {
			t.Errorf("fleet.nodes asked %+v: want a page of at most 100, and the search's labels with its cursor", a)
		}
		paged = paged || a.Cursor != ""
	}
	if !paged {
		t.Errorf("no fleet.nodes request with a cursor: %+v", r.BigRequests)
	}

	shot := filepath.Join(artefacts, "dashboard.png")
	if st, err := os.Stat(shot); err != nil || st.Size() == 0 {
		t.Fatalf("no screenshot %s: %v", shot, err)
	}
	if *updateScreenshot {
		b, err := os.ReadFile(shot)
		if err == nil {
			err = os.WriteFile(filepath.Join("..", "docs", "dashboard.png"), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// hostileUpstream writes a remotes file for all-in-one: one upstream,
// shady, a seed-002 action endpoint whose one tool, lookup, has
// hostileDescription for its description. It returns the file's path.
func hostileUpstream(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	reply, err := json.Marshal(map[string]any{"type": "result", "tools": []any{map[string]any{
		"name": "lookup", "description": hostileDescription, "input_schema": map[string]any{"type": "object"}}}})
	if err != nil {
		t.Fatal(err)
	}
	replyFile, script := filepath.Join(dir, "reply.json"), filepath.Join(dir, "shady.sh")
	// It answers every request with its list: the test only lists it.
	if err := os.WriteFile(replyFile, append(reply, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat >/dev/null\nexec cat "+replyFile+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	config := "upstreams:\n  - name: shady\n    transport: action\n    command: [" + script + "]\n" +
		"    tenants: [demo]\n    allow: [lookup]\n    safety: {lookup: read_only}\n"
	path := filepath.Join(dir, "remotes.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// listenHostile declares, as another agent of the tenant, a caller tool
// whose description is hostileDescription, keeps its listen open until
// the test ends, and returns the tool's listed name.
func (o *okso) listenHostile(t *testing.T) string {
	t.Helper()
	const callerID, tool = "evil", "markup"
	ready := make(chan struct{})
	var once sync.Once
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-interop-hostile", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			if strings.Contains(req.Params.Message, "caller_tools_ready") {
				once.Do(func() { close(ready) })
			}
		},
	})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{
		Endpoint:   o.mcpURL,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: o.mintAs(t, "hostile", auth.ScopeMutating), Base: tr}},
		MaxRetries: -1,
	}, &sdk.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect the hostile agent: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, &sdk.CallToolParams{Name: "caller_tools_listen", Meta: sdk.Meta{"progressToken": "hostile"},
			Arguments: map[string]any{"caller_id": callerID, "tools": []any{map[string]any{
				"name": tool, "description": hostileDescription,
				"inputSchema": map[string]any{"type": "object", "properties": map[string]any{
					"text": map[string]any{"type": "string", "description": hostileDescription}}},
				"annotations": map[string]any{"readOnlyHint": true},
			}}}})
		done <- err
	}()
	t.Cleanup(func() {
		stop()
		<-done
		_ = s.Close()
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the hostile agent's listen ended: %v\nokso log:\n%s", err, o.stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("the hostile agent's listen not ready within 30 s\nokso log:\n%s", o.stderr)
	}
	return callerID + "_" + tool
}
