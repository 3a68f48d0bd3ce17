package roles

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oklog/run"
	"github.com/spf13/cobra"
)

// stdioConnectTimeout bounds the first exchange with the gateway, so
// that a host starting `okso stdio` against an address that swallows
// packets hears why within a host's usual start-up patience.
const stdioConnectTimeout = 20 * time.Second

// listChangedMarker names the one tool of the stdio server's own tool
// set. The SDK sends notifications/tools/list_changed only when that set
// changes (Server.changeAndNotify: to every session of the 2025
// revisions, and to those of 2026-07-28 that subscribed), and AddTool
// always counts as a change: re-adding the marker is how a list_changed
// of the gateway is passed on. It is never listed nor called, because
// tools/list and tools/call go to the gateway.
const listChangedMarker = "okso-stdio-list-changed"

func stdioCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg  StdioConfig
		logs logFlags
	)
	cmd := &cobra.Command{
		Use:   "stdio",
		Short: "Serve a gateway's tools as an MCP server on stdin/stdout, for agent hosts that start servers as commands",
		Long: "okso stdio is the MCP server an agent host launches as a local command (Claude Desktop,\n" +
			"Cursor, Codex, Zed): it serves on stdin/stdout exactly what the gateway at --url serves\n" +
			"to --token (or OKSO_TOKEN) — the tools as listed, calls, errors, progress, cancellation\n" +
			"and notifications/tools/list_changed — over one connection to the gateway. Logs go to\n" +
			"stderr; stdout is the protocol. A gateway that cannot be reached or refuses the token\n" +
			"at the start ends it at once with one line on stderr saying why, and exit status 1;\n" +
			"one that goes away later (a restarted all-in-one) is connected to again when it is back.",
		Example: `  OKSO_TOKEN="$(okso token mint --tenant demo)" okso stdio --url http://127.0.0.1:8080/mcp`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Only MCP messages may be written to stdout.
			in, out := cmd.InOrStdin(), cmd.OutOrStdout()
			return serve(contextOf(cmd), stderr, &logs, func(_ context.Context, log *slog.Logger, _ telemetry) (func(context.Context) error, error) {
				s, err := NewStdio(log, cfg)
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { return s.Run(ctx, in, out) }, nil
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.URL, "url", "http://"+DefaultMCPAddr+"/mcp", "the gateway's MCP endpoint, http:// or https://")
	fs.StringVar(&cfg.Token, "token", "", "agent token (okso token mint), sent as a bearer token")
	fs.StringVar(&cfg.CA, "ca", "", "PEM bundle of CA certificates trusted for an https:// --url, besides the system's roots")
	logs.add(fs)
	return cmd
}

// StdioConfig configures [NewStdio].
type StdioConfig struct {
	URL   string // the gateway's MCP endpoint
	Token string // an agent token, sent as a bearer token
	CA    string // PEM bundle trusted for https://, besides the system's roots ("": the system's alone)
}

// Stdio relays one MCP client on a byte stream (a host's pipes) to a
// client session of a gateway. Make it with [NewStdio]; it is used once.
type Stdio struct {
	log  *slog.Logger
	cfg  StdioConfig
	auth *gatewayTransport
	http *http.Client

	gw  atomic.Pointer[sdk.ClientSession] // the session requests go to
	srv atomic.Pointer[sdk.Server]        // the host's, once it exists
}

// NewStdio checks cfg and prepares the HTTP client of the gateway; it
// does not dial yet.
func NewStdio(log *slog.Logger, cfg StdioConfig) (*Stdio, error) {
	if cfg.Token == "" {
		return nil, errors.New("--token (or OKSO_TOKEN): an agent token is required (okso token mint prints one)")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q: want the gateway's MCP endpoint, http://HOST:PORT/mcp or https://", cfg.URL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CA != "" {
		if u.Scheme != "https" {
			return nil, fmt.Errorf("--ca: --url %s is not https://", cfg.URL)
		}
		pool, err := caPool("--ca", cfg.CA)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	a := &gatewayTransport{token: cfg.Token, next: tr, listenEnded: make(chan struct{}, 1)}
	return &Stdio{log: log, cfg: cfg, auth: a, http: &http.Client{Transport: a}}, nil
}

// Run connects to the gateway, then serves MCP on in and out until in
// ends (the host closed it: a clean stop) or ctx does. A gateway that
// cannot be reached or refuses the token at the start is an error at
// once; later, while it is away, the host's requests fail with an error
// that says so, and the session comes back with it.
func (s *Stdio) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	defer s.http.CloseIdleConnections()
	gw, err := s.connect(ctx)
	if err != nil {
		return s.connectError(err)
	}
	s.gw.Store(gw)
	// Sessions replaced by a reconnection are closed at the end, with the
	// last: Close waits for their calls in flight, which the host's end
	// cancels.
	var retired []*sdk.ClientSession
	defer func() {
		for _, gw := range append(retired, s.gw.Load()) {
			_ = gw.Close()
		}
	}()
	hello := gw.InitializeResult()
	s.log.Info("connected to the gateway", "url", s.cfg.URL, "protocol", hello.ProtocolVersion)

	impl := &sdk.Implementation{Name: "okso", Version: Version}
	if hello.ServerInfo != nil {
		impl = hello.ServerInfo
	}
	// Tools, as okso serves, with list_changed, which this session can
	// always carry to the host; and logging if the gateway declares it
	// (hosts of the 2025 revisions set a level and expect it accepted).
	caps := &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{ListChanged: true}}
	if hello.Capabilities != nil {
		//lint:ignore SA1019 deprecated from 2026-07-28, declared by the gateway for the 2025 revisions' clients
		caps.Logging = hello.Capabilities.Logging
	}
	server := sdk.NewServer(impl, &sdk.ServerOptions{Instructions: hello.Instructions, Capabilities: caps})
	server.AddReceivingMiddleware(s.forward)
	s.srv.Store(server)

	t := &sdk.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}}
	return runGroup(ctx,
		func(g *run.Group) { contextActor(g, func(ctx context.Context) error { return server.Run(ctx, t) }) },
		func(g *run.Group) {
			contextActor(g, func(ctx context.Context) error {
				return s.reconnect(ctx, func(gw *sdk.ClientSession) { retired = append(retired, gw) })
			})
		},
	)
}

// connect makes a client session of the gateway. Its handlers pass the
// gateway's notifications on to the host.
func (s *Stdio) connect(ctx context.Context) (*sdk.ClientSession, error) {
	client := sdk.NewClient(&sdk.Implementation{Name: "okso-stdio", Version: Version}, &sdk.ClientOptions{
		// Setting it also makes the SDK open subscriptions/listen on a
		// 2026-07-28 gateway, the one way a stateless gateway can send it.
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { s.listChanged() },
		// The forwarded call carries the host's own _meta, progressToken
		// included, so the gateway's progress is already the host's.
		ProgressNotificationHandler: func(ctx context.Context, req *sdk.ProgressNotificationClientRequest) {
			server := s.srv.Load()
			if server == nil {
				return
			}
			for ss := range server.Sessions() { // one: the host's
				if err := ss.NotifyProgress(ctx, req.Params); err != nil {
					s.log.Debug("progress not passed on to the host", "err", err)
				}
			}
		},
	})
	ctx, cancel := context.WithTimeout(ctx, stdioConnectTimeout)
	defer cancel()
	return client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: s.http}, nil)
}

// listChanged tells the host that the list of tools changed.
func (s *Stdio) listChanged() {
	if server := s.srv.Load(); server != nil {
		server.AddTool(&sdk.Tool{Name: listChangedMarker, InputSchema: map[string]any{"type": "object"}}, nil)
	}
}

// reconnect makes a new session whenever the gateway's notification
// stream (subscriptions/listen) ends: the gateway restarted, or went
// away. The SDK opens that stream once per session and does not open it
// again, so without a new session list_changed would stop for good.
// The host is then told the list changed, as it may have meanwhile. A
// token refused on the way ends it with the refusal; replaced sessions
// go to retire.
func (s *Stdio) reconnect(ctx context.Context, retire func(*sdk.ClientSession)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.auth.listenEnded:
		}
		s.log.Warn("the gateway's notification stream ended: connecting again", "url", s.cfg.URL)
		for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
			gw, err := s.connect(ctx)
			if err == nil {
				retire(s.gw.Swap(gw))
				s.log.Info("gateway back", "url", s.cfg.URL)
				s.listChanged()
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			if s.auth.refusal() != "" {
				return s.connectError(err)
			}
			s.log.Warn("gateway unreachable", "url", s.cfg.URL, "err", err, "retry_in", delay)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
		}
	}
}

// forward answers tools/list and tools/call with the gateway's answer,
// as it is: its result, or its JSON-RPC error (code, message, data). The
// call's context is the host's request: a notifications/cancelled of the
// host cancels it, and the SDK client then sends its own to the gateway.
// Every other method is the SDK server's (initialize, ping, ...).
func (s *Stdio) forward(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		gw := s.gw.Load()
		switch r := req.(type) {
		case *sdk.ListToolsRequest:
			res, err := gw.ListTools(ctx, r.Params)
			if unsent(err) {
				// A list can be asked again: the first request after
				// the gateway restarted may go out on a connection it
				// closed.
				res, err = gw.ListTools(ctx, r.Params)
			}
			if err != nil {
				return nil, s.gatewayError(ctx, method, err)
			}
			if legacy(r.Session) {
				res.ResultType = ""
				delete(res.Meta, sdk.MetaKeyServerInfo)
			}
			return res, nil
		case *sdk.CallToolRequest:
			p := r.Params
			res, err := gw.CallTool(ctx, &sdk.CallToolParams{Meta: p.Meta, Name: p.Name, Arguments: p.Arguments,
				InputResponses: p.InputResponses, RequestState: p.RequestState})
			if err != nil {
				return nil, s.gatewayError(ctx, method, err)
			}
			if legacy(r.Session) {
				// A copy: resultType is unexported on this type.
				delete(res.Meta, sdk.MetaKeyServerInfo)
				res = &sdk.CallToolResult{Meta: res.Meta, Content: res.Content,
					StructuredContent: res.StructuredContent, IsError: res.IsError}
			}
			return res, nil
		}
		return next(ctx, method, req)
	}
}

// legacy tells a host of the 2025 revisions, to which the gateway's
// answers (decoded at 2026-07-28) are given as the gateway gives them to
// such a client: without resultType, and without serverInfo in _meta.
func legacy(ss *sdk.ServerSession) bool {
	p := ss.InitializeParams()
	return p != nil && p.ProtocolVersion < statelessRevision
}

// statelessRevision is the MCP revision from which every result carries
// resultType and the server's identity (SEP-2575, SEP-2322).
const statelessRevision = "2026-07-28"

// The SDK client's own failures carry jsonrpc2 codes of its own, which
// no gateway sends: a request its transport did not send (rejected), and
// a connection closing on either side.
const (
	codeRejected      = -32005
	codeClientClosing = -32003
	codeServerClosing = -32004
)

// unsent tells an error of a request that did not reach the gateway.
func unsent(err error) bool {
	var we *jsonrpc.Error
	return errors.As(err, &we) && we.Code == codeRejected
}

// gatewayError is err as the host gets it: the gateway's JSON-RPC error
// unchanged (the SDK client wraps it with the method), else an internal
// error that says the gateway was not reached or did not answer.
func (s *Stdio) gatewayError(ctx context.Context, method string, err error) error {
	if ctx.Err() != nil {
		return err
	}
	var we *jsonrpc.Error
	if errors.As(err, &we) && we.Code != codeRejected && we.Code != codeClientClosing && we.Code != codeServerClosing {
		return we
	}
	msg := fmt.Sprintf("okso stdio: %s to the gateway %s: %v", method, s.cfg.URL, err)
	if why := s.auth.refusal(); why != "" {
		msg = fmt.Sprintf("okso stdio: the gateway %s refused the token: %s", s.cfg.URL, why)
	}
	s.log.Warn(msg)
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: msg}
}

// connectError says in one line why the gateway could not be used.
func (s *Stdio) connectError(err error) error {
	if why := s.auth.refusal(); why != "" {
		return fmt.Errorf("the gateway %s refused the token: %s (okso token mint makes another)", s.cfg.URL, why)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the gateway %s did not answer within %v", s.cfg.URL, stdioConnectTimeout)
	}
	var unknownCA x509.UnknownAuthorityError
	if errors.As(err, &unknownCA) {
		return fmt.Errorf("cannot reach the gateway %s: %w (--ca FILE trusts the CA that signed its certificate)", s.cfg.URL, err)
	}
	return fmt.Errorf("cannot reach the gateway %s: %w", s.cfg.URL, err)
}

// gatewayTransport sends the token with every request; it remembers the
// last refusal of it (401 or 403, with what the gateway said), which the
// SDK client's errors do not carry, and tells on listenEnded when the
// response stream of a subscriptions/listen ends. It is safe for
// concurrent use.
type gatewayTransport struct {
	token       string
	next        http.RoundTripper
	refused     atomic.Pointer[string]
	listenEnded chan struct{} // buffered 1: one signal pending at most
}

func (b *gatewayTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	listen := isListen(r)
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := b.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		if resp.StatusCode < 300 {
			b.refused.Store(nil)
		}
		if listen && resp.StatusCode == http.StatusOK {
			resp.Body = &endWatch{ReadCloser: resp.Body, ended: b.listenEnded}
		}
		return resp, nil
	}
	// The body says why (expired, revoked, signed by another key); it is
	// read here and given back to the SDK whole.
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	why := fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	if msg := strings.TrimSpace(string(head)); msg != "" {
		why += ": " + strings.Join(strings.Fields(msg), " ")
	}
	b.refused.Store(&why)
	return resp, nil
}

// isListen tells a POST of subscriptions/listen, from a copy of its
// body (the SDK's requests can give one).
func isListen(r *http.Request) bool {
	if r.Method != http.MethodPost || r.GetBody == nil {
		return false
	}
	body, err := r.GetBody()
	if err != nil {
		return false
	}
	defer body.Close()
	head, _ := io.ReadAll(io.LimitReader(body, 4096))
	return bytes.Contains(head, []byte(`"method":"subscriptions/listen"`))
}

// endWatch signals ended once, when its stream fails or ends.
type endWatch struct {
	io.ReadCloser
	ended chan<- struct{}
	once  sync.Once
}

func (w *endWatch) Read(p []byte) (int, error) {
	n, err := w.ReadCloser.Read(p)
	if err != nil {
		w.signal()
	}
	return n, err
}

func (w *endWatch) Close() error {
	w.signal()
	return w.ReadCloser.Close()
}

func (w *endWatch) signal() {
	w.once.Do(func() {
		select {
		case w.ended <- struct{}{}:
		default:
		}
	})
}

// refusal is why the token was last refused, "" if the last answer was
// not a refusal.
func (b *gatewayTransport) refusal() string {
	if p := b.refused.Load(); p != nil {
		return *p
	}
	return ""
}

type readCloser struct {
	io.Reader
	io.Closer
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
