package roles

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// TestStdioFlags: every bad start of okso stdio is refused with an error
// that names what is wrong, before anything is dialled.
func TestStdioFlags(t *testing.T) {
	t.Setenv("OKSO_TOKEN", "") // not the developer's
	caFile := filepath.Join(t.TempDir(), "none.pem")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stdio"}, "--token (or OKSO_TOKEN): an agent token is required"},
		{[]string{"stdio", "--token", "T", "--url", "127.0.0.1:8080"}, `--url "127.0.0.1:8080": want the gateway's MCP endpoint`},
		{[]string{"stdio", "--token", "T", "--url", "ws://127.0.0.1:8080/mcp"}, `--url "ws://127.0.0.1:8080/mcp"`},
		{[]string{"stdio", "--token", "T", "--url", "http:///mcp"}, `--url "http:///mcp"`},
		{[]string{"stdio", "--token", "T", "--ca", caFile}, "--ca: --url http://127.0.0.1:8080/mcp is not https://"},
		{[]string{"stdio", "--token", "T", "--url", "https://127.0.0.1:8080/mcp", "--ca", caFile}, "--ca: open " + caFile},
		{[]string{"stdio", "--token", "T", "extra"}, `unknown command "extra"`},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			root := NewRoot(io.Discard, io.Discard)
			root.SetArgs(c.args)
			root.SetIn(strings.NewReader(""))
			err := root.ExecuteContext(t.Context())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("okso %s: %v, want an error saying %q", strings.Join(c.args, " "), err, c.want)
			}
		})
	}
}

// stdioSession runs s on a pipe pair and returns a Go SDK client session
// of a host of protocol version on its other end; the end of the test
// closes the host's side and waits for Run to return nil.
func stdioSession(t *testing.T, s *Stdio, version string) *sdk.ClientSession {
	t.Helper()
	return stdioSessionWith(t, s, version, nil)
}

// stdioSessionWith is stdioSession with the host's client options.
func stdioSessionWith(t *testing.T, s *Stdio, version string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	hostIn, stdout := io.Pipe()
	stdin, hostOut := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- s.Run(t.Context(), stdin, stdout) }()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test-host", Version: "1"}, opts)
	cs, err := c.Connect(t.Context(), &sdk.IOTransport{Reader: hostIn, Writer: hostOut}, &sdk.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("host connect to okso stdio: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.Close() // closes hostOut: okso stdio's stdin ends
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("okso stdio ended with %v once its stdin did, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("okso stdio did not end within 10 s of its stdin")
		}
	})
	return cs
}

// TestStdioRelay checks okso stdio in process, against an all-in-one,
// with the Go SDK client as the host: the list, a call and the errors
// are the gateway's, for a host of the 2025 revisions (which the answers
// of the gateway, read at 2026-07-28, are given as the gateway gives
// them) and one of 2026-07-28.
func TestStdioRelay(t *testing.T) {
	f := startAllInOne(t, 1, nil)
	token := f.token(auth.MintOptions{})
	direct := f.client(token, "2025-11-25")
	want, err := direct.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	echo := "" // by the name it is listed with, whichever form that is
	for _, tl := range want.Tools {
		if strings.HasPrefix(tl.Name, "sysecho") {
			echo = tl.Name
		}
	}
	if echo == "" {
		t.Fatal("the gateway lists no echo tool")
	}
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			s, err := NewStdio(slog.New(slog.DiscardHandler), StdioConfig{URL: f.a.MCPURL(), Token: token})
			if err != nil {
				t.Fatal(err)
			}
			host := stdioSession(t, s, version)
			got, err := host.ListTools(t.Context(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Tools, want.Tools) || got.NextCursor != want.NextCursor {
				t.Errorf("okso stdio lists %d tools, the gateway %d, or not the same", len(got.Tools), len(want.Tools))
			}

			res, err := host.CallTool(t.Context(), &sdk.CallToolParams{Name: echo, Arguments: map[string]any{"message": "ping"}})
			if err != nil || res.IsError {
				t.Fatalf("echo: %v %+v", err, res)
			}
			if m, _ := res.StructuredContent.(map[string]any); m["message"] != "ping" {
				t.Errorf("echo answered %v", res.StructuredContent)
			}

			_, gotErr := host.CallTool(t.Context(), &sdk.CallToolParams{Name: "no_such_tool"})
			_, wantErr := direct.CallTool(t.Context(), &sdk.CallToolParams{Name: "no_such_tool"})
			var g, w *jsonrpc.Error
			if !errors.As(gotErr, &g) || !errors.As(wantErr, &w) || g.Code != w.Code || g.Message != w.Message || string(g.Data) != string(w.Data) {
				t.Errorf("unknown tool: okso stdio answers %v, the gateway %v", gotErr, wantErr)
			}
		})
	}
}

// TestStdioRefusedToken: a token the gateway refuses ends Run at once
// with what the gateway said.
func TestStdioRefusedToken(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	expired := auth.MintOptions{TTL: time.Hour, Now: time.Now().Add(-2 * time.Hour)}
	for _, c := range []struct {
		what, token, want string
	}{
		{"not a token", "nope", "refused the token: 401 Unauthorized: invalid token"},
		{"expired", f.token(expired), "refused the token: 401 Unauthorized: invalid token"},
	} {
		t.Run(c.what, func(t *testing.T) {
			s, err := NewStdio(slog.New(slog.DiscardHandler), StdioConfig{URL: f.a.MCPURL(), Token: c.token})
			if err != nil {
				t.Fatal(err)
			}
			in, _ := io.Pipe() // a host that keeps its pipe open
			err = s.Run(t.Context(), in, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Run: %v, want %q", err, c.want)
			}
			t.Logf("okso: %v", err)
		})
	}
}

// TestStdioTLS: --ca is how okso stdio trusts a gateway whose certificate
// a private CA signs; without it the handshake's refusal is the error.
func TestStdioTLS(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	cert, key := ca.WriteLeaf(t, dir, 1)
	f := startAllInOne(t, 1, func(c *AllInOneConfig) { c.TLS = tlsFiles{Cert: cert, Key: key} })
	token := f.token(auth.MintOptions{})
	if !strings.HasPrefix(f.a.MCPURL(), "https://") {
		t.Fatalf("all-in-one with TLS serves %s", f.a.MCPURL())
	}

	s, err := NewStdio(slog.New(slog.DiscardHandler), StdioConfig{URL: f.a.MCPURL(), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	in, _ := io.Pipe()
	if err := s.Run(t.Context(), in, io.Discard); err == nil || !strings.Contains(err.Error(), "--ca FILE trusts the CA") {
		t.Errorf("without --ca: %v, want the certificate refused", err)
	} else {
		t.Logf("without --ca: okso: %v", err)
	}

	s, err = NewStdio(slog.New(slog.DiscardHandler), StdioConfig{URL: f.a.MCPURL(), Token: token, CA: ca.WriteCA(t, dir)})
	if err != nil {
		t.Fatal(err)
	}
	host := stdioSession(t, s, "2025-11-25")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if l, err := host.ListTools(ctx, nil); err != nil || len(l.Tools) == 0 {
		t.Errorf("with --ca: %v, %d tools", err, len(l.Tools))
	}
}

// TestStdioGatewayRestart: a laptop's all-in-one restarted under a
// running okso stdio. The host keeps its session: the list answers at
// once, and list_changed still comes as devices connect (the SDK client
// opens its subscriptions/listen again).
func TestStdioGatewayRestart(t *testing.T) {
	dir := t.TempDir()
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.DataDir = dir })
	token := f.token(auth.MintOptions{})
	s, err := NewStdio(slog.New(slog.DiscardHandler), StdioConfig{URL: f.a.MCPURL(), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	changed := make(chan struct{}, 64)
	host := stdioSessionWith(t, s, "2025-11-25", &sdk.ClientOptions{
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { changed <- struct{}{} },
	})
	waitChanged := func(what string) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(30 * time.Second):
			t.Fatalf("no list_changed within 30 s after %s", what)
		}
	}
	f.connectDevice(DefaultTenant, nil)
	waitChanged("a device connected")

	u, err := url.Parse(f.a.MCPURL())
	if err != nil {
		t.Fatal(err)
	}
	f.stop()
	f = startAllInOne(t, 0, func(c *AllInOneConfig) { c.DataDir, c.Gateway.Addr = dir, u.Host })
	if _, err := host.ListTools(t.Context(), nil); err != nil {
		t.Errorf("tools/list after the gateway restarted: %v", err)
	}
	for len(changed) > 0 {
		<-changed
	}
	f.connectDevice(DefaultTenant, nil)
	waitChanged("a device connected to the restarted gateway")
}

// TestStdioCancel: the metric stream's frames reach the host as progress
// of its own token, and the host's notifications/cancelled reaches the
// gateway as a cancellation of that call (its relay on NATS), which ends
// the device's stream while okso stdio stays connected.
func TestStdioCancel(t *testing.T) {
	f := startAllInOne(t, 1, nil)
	cancels, err := f.nc.SubscribeSync(bus.CallCancel("*"))
	if err != nil {
		t.Fatal(err)
	}
	audit, err := f.nc.SubscribeSync(bus.Audit(DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s, err := NewStdio(slog.New(slog.DiscardHandler), StdioConfig{URL: f.a.MCPURL(), Token: f.token(auth.MintOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	progress := make(chan *sdk.ProgressNotificationParams, 16)
	host := stdioSessionWith(t, s, "2025-11-25", &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) { progress <- req.Params },
	})
	var stream string
	for tl, err := range host.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(tl.Name, "metrics.subscribe") || strings.HasSuffix(tl.Name, "metrics-subscribe") {
			stream = tl.Name
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := host.CallTool(ctx, &sdk.CallToolParams{Name: stream, Arguments: map[string]any{"interval_ms": 1000},
			Meta: sdk.Meta{"progressToken": "host-token-7"}})
		done <- err
	}()
	select {
	case p := <-progress:
		if p.ProgressToken != "host-token-7" || !strings.Contains(p.Message, `"node_id"`) {
			t.Errorf("progress %+v: want a metrics frame for the host's token host-token-7", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no progress within 10 s of the stream's call")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled call returned %v", err)
	}
	if _, err := cancels.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("no cancellation of the call reached the gateway within 5 s: %v", err)
	}
	for {
		m, err := audit.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("the cancelled stream did not end within 5 s: %v", err)
		}
		var e bus.AuditEvent
		if json.Unmarshal(m.Data, &e) == nil && e.Decision == bus.DecisionStreamClosed && e.Tool == strings.ReplaceAll(stream, "-", ".") {
			break
		}
	}
}
