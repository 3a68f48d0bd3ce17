package roles

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

// runRoot runs the okso command with args in this process until stop,
// which cancels it and returns what it returned.
func runRoot(t *testing.T, stdout, stderr io.Writer, args ...string) (stop func() error) {
	t.Helper()
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var (
		stopped bool
		err     error
	)
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				err = fmt.Errorf("okso %s did not stop", strings.Join(args, " "))
			}
			// Keep-alive connections of the tests' clients would outlive the run.
			http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		}
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return stop
}

// bannerRow waits for the banner row label and returns its value.
func bannerRow(t *testing.T, out *logSink, label string) string {
	t.Helper()
	prefix := fmt.Sprintf("  %-12s : ", label)
	return strings.TrimPrefix(out.waitText(t, "banner row "+label, func(l string) bool {
		return strings.HasPrefix(l, prefix)
	}), prefix)
}

// mcpSession connects an MCP client to url with token.
func mcpSession(t *testing.T, url, token string) *sdk.ClientSession {
	t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{
		Endpoint: url, HTTPClient: &httpClientWithToken(token).Client, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect MCP client: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// toolsOf lists the tools a session sees whose name ends with suffix.
func toolsOf(t *testing.T, s *sdk.ClientSession, suffix string) []string {
	t.Helper()
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range list.Tools {
		if strings.HasSuffix(tl.Name, schemas.SafeToolName(suffix)) {
			names = append(names, tl.Name)
		}
	}
	return names
}

// TestBanner runs `okso all-in-one` as a person would and follows its
// banner: the rows scripts read are there, the data dir is the one given,
// the printed token is read-only, the printed `token mint` command (run
// as printed) gives a token that may drive a mock device's pin, and the
// Inspector line names the pinned release, its Node.js and this endpoint.
func TestBanner(t *testing.T) {
	dataDir := t.TempDir()
	stdout, stderr := newLogSink(), newLogSink()
	stop := runRoot(t, stdout, stderr, "all-in-one", "--data-dir", dataDir, "--mcp-addr", "127.0.0.1:0",
		"--device-addr", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--mock", "1", "--local-agent=false",
		"--metrics-addr", "127.0.0.1:0")

	logs := bannerRow(t, stdout, "logs") // the last row: the banner is whole
	var labels []string
	for _, l := range stdout.textLines() {
		if label, _, ok := strings.Cut(l, " : "); ok && strings.HasPrefix(label, "  ") {
			labels = append(labels, strings.TrimSpace(label))
		}
	}
	want := []string{"MCP endpoint", "dashboard", "device tier", "metrics", "NATS", "data dir", "mock devices", "agent token", "token mint", "try it", "sign in", "logs"}
	if !slices.Equal(labels, want) {
		t.Errorf("banner rows %q, want %q:\n%s", labels, want, stdout)
	}
	mcpURL := bannerRow(t, stdout, "MCP endpoint")
	if !strings.HasPrefix(mcpURL, "http://127.0.0.1:") || !strings.HasPrefix(bannerRow(t, stdout, "device tier"), "ws://127.0.0.1:") ||
		!strings.HasPrefix(bannerRow(t, stdout, "NATS"), "nats://127.0.0.1:") {
		t.Errorf("banner endpoints:\n%s", stdout)
	}
	// The dashboard row names the page the gateway serves.
	if d := bannerRow(t, stdout, "dashboard"); d != strings.TrimSuffix(mcpURL, "/mcp")+"/ui/" {
		t.Errorf("dashboard row %q, want the gateway's /ui/", d)
	} else if resp, err := http.Get(d); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %v %v", d, resp, err)
	} else {
		resp.Body.Close()
	}
	// The metrics row names where a scrape gets them.
	if m := bannerRow(t, stdout, "metrics"); !strings.HasPrefix(m, "http://127.0.0.1:") || !strings.HasSuffix(m, "/metrics") {
		t.Errorf("metrics row %q", m)
	} else if resp, err := http.Get(m); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %v %v", m, resp, err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "okso_gateway_nodes") || !strings.Contains(string(b), "okso_tier_sessions") {
			t.Errorf("GET %s: no gateway or tier metrics:\n%.2000s", m, b)
		}
	}
	if dir := bannerRow(t, stdout, "data dir"); dir != dataDir {
		t.Errorf("data dir %q, want %q", dir, dataDir)
	}
	if logs != "stderr, json, with a line per audit event" {
		t.Errorf("logs row %q: stderr is no terminal here", logs)
	}
	token := bannerRow(t, stdout, "agent token")
	// The printed token lasts as long as one okso token mint prints, and
	// its row says until when, as token mint does.
	claims, err := auth.UnverifiedClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(claims.ExpiresAt.Time); left < agentTokenTTL-time.Minute || left > agentTokenTTL {
		t.Errorf("the printed token expires in %s, want %s", left, agentTokenTTL)
	}
	wantValid := "valid 30 days, until " + claims.ExpiresAt.UTC().Format(time.RFC3339) + ":"
	if !strings.Contains(stdout.String(), wantValid) {
		t.Errorf("the banner does not say %q:\n%s", wantValid, stdout)
	}

	inspector := bannerRow(t, stdout, "try it")
	wantInspector := fmt.Sprintf("npx -y @modelcontextprotocol/inspector@%s --cli %s --transport http "+
		"--header \"Authorization: Bearer %s\" --method tools/list", inspectorVersion, mcpURL, token)
	if inspector != wantInspector {
		t.Errorf("try it row\n%s\nwant\n%s", inspector, wantInspector)
	}
	if !strings.Contains(stdout.String(), "Node.js >= "+inspectorNode) {
		t.Errorf("the banner does not say the Inspector asks for Node.js >= %s:\n%s", inspectorNode, stdout)
	}

	// The token mint row, run as printed (after the command that names okso).
	mintRow := strings.Fields(bannerRow(t, stdout, "token mint"))
	i := slices.Index(mintRow, "token")
	if i < 1 || i+1 >= len(mintRow) || mintRow[i+1] != "mint" ||
		!slices.Contains(mintRow, dataDir) || !slices.Contains(mintRow, auth.ScopeMutating) {
		t.Fatalf("token mint row %q", mintRow)
	}
	var minted, mintErr bytes.Buffer
	root := NewRoot(&minted, &mintErr)
	root.SetArgs(mintRow[i:])
	if err := root.Execute(); err != nil {
		t.Fatalf("okso %s: %v", strings.Join(mintRow[i:], " "), err)
	}

	stderr.wait(t, "the mock device", line("mock devices connected"))
	readOnly := mcpSession(t, mcpURL, token)
	if w := toolsOf(t, readOnly, ".pin.write"); len(w) != 0 {
		t.Errorf("the printed read-only token lists %v", w)
	}
	mutating := mcpSession(t, mcpURL, strings.TrimSpace(minted.String()))
	writes := toolsOf(t, mutating, ".pin.write")
	if len(writes) != 1 {
		t.Fatalf("the minted token lists pin.write tools %v, want one", writes)
	}
	res, err := mutating.CallTool(t.Context(), &sdk.CallToolParams{Name: writes[0], Arguments: map[string]any{"level": 1}})
	if err != nil || res.IsError {
		t.Fatalf("pin.write with the minted token: %v %+v", err, res)
	}
	if err := stop(); err != nil {
		t.Errorf("all-in-one: %v", err)
	}
}

// TestSelfCommand: the banner's commands start the way this okso was
// started, and `go run .` when go run built it.
func TestSelfCommand(t *testing.T) {
	for arg0, want := range map[string]string{
		"/tmp/go-build2961/b001/exe/okso": "go run .",
		"okso":                            "okso",
		"./bin/okso":                      "./bin/okso",
		"/opt/my okso/okso":               "'/opt/my okso/okso'",
		"/opt/it's/okso":                  `'/opt/it'\''s/okso'`,
		"":                                "okso",
	} {
		if got := selfCommand(arg0); got != want {
			t.Errorf("selfCommand(%q) = %s, want %s", arg0, got, want)
		}
	}
}

// TestReadmeNamesTheBannersInspector: the README's Inspector commands use
// the release the banner names, and say the Node.js it asks for.
func TestReadmeNamesTheBannersInspector(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "@modelcontextprotocol/inspector"); n == 0 ||
		n != strings.Count(readme, "@modelcontextprotocol/inspector@"+inspectorVersion+" ") {
		t.Errorf("the README names the Inspector %d times, not all as release %s", n, inspectorVersion)
	}
	if !strings.Contains(readme, "Node.js >= "+inspectorNode) {
		t.Errorf("the README does not say the Inspector asks for Node.js >= %s", inspectorNode)
	}
}
