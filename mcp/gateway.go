// Package mcp is the agents' side of okso: the gateway that serves MCP
// (Streamable HTTP, official Go SDK) at /mcp, projects every capability of
// every live node of the caller's tenant as a tool, checks each call
// (name, tenant, scope, arguments) before it reaches NATS, and checks each
// answer (output schema, node id) before it reaches the agent.
//
// Every tool lives in one catalog (catalog.go), fed by its sources
// (source.go: devices, upstreams, callers' own tools) and holding okso's
// own (the relay's, and the fleet tools of fleet.go, which read the
// device source's presence memory and the catalog itself); every door
// looks a tool up there once per call, runs the same checks on what it
// finds (call.go) and calls the entry's invoker.
//
// Every request to a door is authenticated first (gate.go).
//
// Create a [Gateway] with [New], run its registry watch with
// [Gateway.Run], and serve [Gateway.Handler]. What it holds is looked at
// through its owners' read-only views: [Gateway.Catalog],
// [Gateway.Devices], [Gateway.Streams], [Gateway.Listens]. It never
// imports the device tier: the two meet on NATS (package bus).
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// Options configure a [Gateway]. NC, Registry, Schemas and Verifier are
// required; every other zero value means the default.
type Options struct {
	NC       *nats.Conn
	Registry *bus.Registry
	// Remotes, when set, is the registry of federated upstreams, whose
	// tools the gateway lists for the tenants each is configured for.
	Remotes *bus.Remotes
	// Callers, when set, is the registry of the callers' own tools: the
	// gateway serves caller_tools_listen and caller_tool_response and
	// lists every live declaration for its tenant (DESIGN.md §9.3).
	Callers *bus.Callers
	// CallerTimeout bounds a relayed call to a caller's tool (60 s).
	CallerTimeout time.Duration
	// Plans, when set, keeps fleet.call's dry runs for any replica to
	// run; without it a dry run, and a run that needs a plan, fail.
	Plans *bus.Plans
	// FleetBudget bounds a whole fleet.call fan-out (30 s): a node that
	// has not answered by then is E_DEADLINE_EXCEEDED in its row.
	FleetBudget time.Duration
	// Relayers, when set, are the roles whose requests on a listen's
	// subjects the gateway serves ([bus.FromRole]): a message that
	// reached one any other way is dropped. Nil: any request.
	Relayers []bus.Role
	Schemas  *schemas.Set
	Verifier TokenVerifier // for agent tokens: an *auth.Verifier, or an *auth.Trust with external issuers
	// AuthorizationServers are the issuers listed in the protected-resource
	// metadata: where a client gets a token the Verifier accepts.
	AuthorizationServers []string
	Auditor              *bus.Auditor
	Logger               *slog.Logger
	// Metrics, when set, is where the gateway registers its metrics
	// (DESIGN.md §11); nil: none.
	Metrics prometheus.Registerer
	// Tracer, when set, makes a span of each tools/call, continuing the
	// caller's trace context and passing its own on (DESIGN.md §11).
	Tracer *tracing.Tracer

	// Budget is the end-to-end deadline of one call (5 s).
	Budget time.Duration
	// Stateful serves MCP sessions (Mcp-Session-Id) for single-replica use;
	// the default is stateless, so any replica answers any request.
	Stateful bool
	// NoFastPath sends every stateless tools/call through the SDK's
	// per-request session (SSE responses) instead of the gateway's fast
	// path (application/json); the checks are the same either way.
	NoFastPath bool
	// AllowedOrigins are extra browser origins trusted to call /mcp.
	AllowedOrigins []string
	// Version is reported to MCP clients.
	Version string
	// ToolNames is the form in which tools/list names tools for a token
	// without a tool_names claim: auth.ToolNamesSafe (the default) or
	// auth.ToolNamesSeed. A call by either form works whatever it is.
	ToolNames string
	// NoNodeTools leaves the per-node device tools out of tools/list for
	// a token without a node_tools claim (DESIGN.md §8, lean lists): they
	// stay callable by name, and fleet.nodes and okso.find_tools still
	// see them. okso's own, upstream and caller tools stay listed.
	NoNodeTools bool
	// Kinds, when set, is the bucket of registered kinds (DESIGN.md §12):
	// the gateway follows it, lists the tools of registered kinds with
	// their registered schemas, checks their arguments and results with
	// them, and serves them at /schemas/. Without it, the built-in kinds
	// alone.
	Kinds *bus.Kinds
	// Revoked, when set, says whether a token id was revoked: such a token
	// is refused (401) and its calls denied.
	Revoked interface{ Revoked(jti string) bool }
	// PublicURL is the gateway's URL as clients reach it (scheme://host),
	// for the protected-resource metadata; empty: as each request says.
	PublicURL string
	// MaxStreamsPerTenant bounds the streams a tenant holds open (256);
	// one more is closed at once with 4429.
	MaxStreamsPerTenant int
	// PingInterval and IdleTimeout are the stream heartbeat (25 s) and the
	// time a client may make no read progress (90 s).
	PingInterval, IdleTimeout time.Duration
	// OAuth, when set, is okso's own authorization server (oauth.go):
	// served next to /mcp, listed in the protected-resource metadata,
	// and its access tokens accepted at /mcp.
	OAuth *OAuthServer
}

// Gateway serves MCP for every tenant: the HTTP surface (the three
// doors: the fast path, the SDK's handler, REST/SSE), authentication, and
// the catalog its sources feed. It is safe for concurrent use.
type Gateway struct {
	o       Options
	log     *slog.Logger
	handler http.Handler
	ready   chan struct{}
	// gate authenticates every request to the doors (gate.go).
	gate *gate
	// metrics count and time the calls (metrics.go); nil: none.
	metrics *callMetrics

	// shelf holds every tenant's tools (the catalog: the one place a
	// tool is looked up), as the sources feed it.
	shelf *shelf
	// sources feed it, each registered once in New. devices and callers
	// (nil without Options.Callers) also answer for their own tools
	// outside the catalog (a node that left, a listen).
	sources []source
	devices *devices
	callers *callers

	// kinds is the kind table the gateway projects with: nil (the
	// built-in kinds alone) until Options.Kinds is first read.
	kinds    atomic.Pointer[schemas.KindTable]
	link     *link       // the NATS connection, down or not
	cancels  cancels     // a call's cancellation from any replica (cancel.go)
	streams  *streams    // held open (stream.go)
	draining atomic.Bool // see Drain
	// form is the form of listed names for tokens that do not say.
	form nameForm

	results  resultWriter // the fast path's (its server info)
	fastMeta metaMemo     // the fast path's decodes of _meta values
	// complete is an empty tools/call result of resultType "complete",
	// to copy (see completed).
	complete sdk.CallToolResult
	// ui serves the dashboard (ui.go).
	ui *dashboard
}

// New checks opts and builds a gateway.
func New(o Options) (*Gateway, error) {
	if o.NC == nil || o.Registry == nil || o.Schemas == nil || o.Verifier == nil {
		return nil, errors.New("gateway: NC, Registry, Schemas and Verifier are required")
	}
	if o.Budget <= 0 {
		o.Budget = 5 * time.Second
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.MaxStreamsPerTenant <= 0 {
		o.MaxStreamsPerTenant = 256
	}
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.CallerTimeout <= 0 {
		o.CallerTimeout = DefaultCallerTimeout
	}
	if o.ToolNames != "" && !auth.ValidToolNames(o.ToolNames) {
		return nil, fmt.Errorf("gateway: tool names %q: want %s or %s", o.ToolNames, auth.ToolNamesSafe, auth.ToolNamesSeed)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{
		o:       o,
		log:     log,
		ready:   make(chan struct{}),
		metrics: newCallMetrics(o.Metrics),
		gate: &gate{verifier: o.Verifier, revocations: o.Revoked, oauth: o.OAuth,
			servers: o.AuthorizationServers, publicURL: o.PublicURL, auditor: o.Auditor},

		streams: newStreams(o.NC, o.MaxStreamsPerTenant),
		link:    &link{nc: o.NC, log: log},
		cancels: cancels{nc: o.NC, stateful: o.Stateful, log: log},
	}
	g.form = formOf(o.ToolNames, formSafe)
	g.shelf = newShelf(g.newServer, log)
	// The sources, one line each.
	g.devices = newDevices(o.NC, o.Registry, o.Schemas, &toolDocs{set: o.Schemas, log: log}, g.kinds.Load, g.shelf, log, g.streams.nodeGone)
	g.sources = append(g.sources, g.devices)
	fl := &fleet{devices: g.devices, cat: g.shelf.catalog, form: g.form, plans: o.Plans, budget: o.FleetBudget}
	if err := addFleet(g.shelf, fl, o.Schemas); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if o.Remotes != nil {
		g.sources = append(g.sources, newUpstreams(o.Remotes, g.shelf, log, o.Budget, &g.shelf.foreignChecks))
	}
	if o.Callers != nil {
		var err error
		g.callers, err = newCallers(callersConfig{nc: o.NC, bucket: o.Callers, relayers: o.Relayers,
			timeout: o.CallerTimeout, budget: o.Budget, ping: o.PingInterval, checks: &g.shelf.foreignChecks, feed: g.shelf, log: log, tracer: o.Tracer,
			cancellable: g.cancels.cancellable, revoked: g.gate.revoked, takeSlot: g.streams.take, releaseSlot: g.streams.release})
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		g.sources = append(g.sources, g.callers)
	}
	ui, err := newDashboard(g)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.ui = ui
	ui.register(o.Metrics)
	g.registerState(o.Metrics)
	info, _ := json.Marshal(implementation(g.o.Version))
	g.results = resultWriter(info)
	if err := json.Unmarshal([]byte(`{"content":[],"resultType":"complete"}`), &g.complete); err != nil {
		return nil, fmt.Errorf("gateway: a complete tool result: %w", err)
	}
	g.handler = g.drainable(g.routes())
	return g, nil
}

// implementation is how a gateway of version introduces itself to MCP
// clients.
func implementation(version string) *sdk.Implementation {
	return &sdk.Implementation{Name: "okso", Title: "okso fleet gateway", Version: version}
}

// Handler returns the gateway's HTTP handler.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Ready is closed once the gateway has loaded the registry.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Wait blocks until cond holds over the gateway's view of the fleet, or ctx
// ends. cond is called with the number of live nodes per tenant.
func (g *Gateway) Wait(ctx context.Context, cond func(nodesByTenant map[string]int) bool) error {
	for {
		ch := g.shelf.next()
		if cond(g.devices.counts()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// EndStreams ends every stream the gateway holds open (it is stopping):
// each subscription gets its 1000 close event, and each caller's listen
// ends, its waiting calls failing E_NODE_OFFLINE at once. The gateway
// goes on answering other requests.
func (g *Gateway) EndStreams() {
	g.streams.closeAll()
	g.ui.endAll()
	if g.callers != nil {
		g.callers.held.endAll("the gateway is stopping")
	}
}

// Kinds returns the kind table the gateway projects with now: nil (the
// built-in kinds alone) until it has read Options.Kinds. A change wakes
// [Gateway.Wait].
func (g *Gateway) Kinds() *schemas.KindTable { return g.kinds.Load() }

// Catalog is a look at the gateway's catalog: the tools it holds, and
// what left it.
func (g *Gateway) Catalog() CatalogView { return CatalogView{g.shelf} }

// Devices is a look at the gateway's device source: the nodes it lists
// and those it remembers as offline.
func (g *Gateway) Devices() DeviceView { return DeviceView{g.devices} }

// Streams is a look at the streams the gateway holds open.
func (g *Gateway) Streams() StreamView { return StreamView{g.streams} }

// Listens is a look at the gateway's caller source: the listens whose
// tools it lists.
func (g *Gateway) Listens() ListenView { return ListenView{g.callers} }

// maxMCPBody bounds the body of one MCP request: a tools/call is small;
// 413 beyond.
const maxMCPBody = 1 << 20

func (g *Gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mcpHandler := sdk.NewStreamableHTTPHandler(g.server, &sdk.StreamableHTTPOptions{
		Stateless:                    !g.o.Stateful,
		PropagateRequestCancellation: true,
		Logger:                       sdkLog(g.log),
		MaxRequestBodyBytes:          maxMCPBody,
	})
	cop := http.NewCrossOriginProtection()
	for _, o := range g.o.AllowedOrigins {
		if err := cop.AddTrustedOrigin(o); err != nil {
			g.log.Warn("ignoring allowed origin", "origin", o, "err", err)
		}
	}
	mux.Handle("/mcp", cop.Handler(g.gate.authenticate(g.fastCall(withHTTPCall(mcpHandler)))))
	mux.Handle("POST /mcp/tools/call", cop.Handler(g.gate.authenticate(http.HandlerFunc(g.serveToolsCall))))
	mux.Handle("GET /schemas/", g.o.Schemas.HandlerWith(g.kinds.Load))
	g.uiRoutes(mux, cop)
	if g.o.OAuth != nil {
		g.o.OAuth.routes(mux, g.gate.baseURL)
	}
	meta := http.HandlerFunc(g.gate.serveResourceMetadata)
	mux.Handle("/.well-known/oauth-protected-resource", meta)
	mux.Handle("/.well-known/oauth-protected-resource/mcp", meta)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-g.ready:
		default:
			http.Error(w, "registry not loaded yet", http.StatusServiceUnavailable)
			return
		}
		if !g.o.NC.IsConnected() {
			http.Error(w, "NATS disconnected", http.StatusServiceUnavailable)
			return
		}
		if g.draining.Load() {
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// Drain prepares the gateway to stop: /readyz answers 503, so load
// balancers send it no more, while it goes on serving what still comes,
// each answer with Connection: close so that no client sends another
// request on a connection the stop will close under it.
func (g *Gateway) Drain() { g.draining.Store(true) }

func (g *Gateway) drainable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.draining.Load() {
			w = closing{w}
		}
		next.ServeHTTP(w, r)
	})
}

// closing answers with Connection: close whatever the handler set (the
// SDK sets keep-alive on its event streams).
type closing struct{ http.ResponseWriter }

func (c closing) WriteHeader(code int) {
	c.Header().Set("Connection", "close")
	c.ResponseWriter.WriteHeader(code)
}

func (c closing) Write(b []byte) (int, error) {
	c.Header().Set("Connection", "close") // no effect once the header is out
	return c.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (c closing) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// sdkLog is the SDK's logger: log, at warnings and above.
func sdkLog(log *slog.Logger) *slog.Logger {
	return slog.New(quietHandler{log.Handler(), slog.LevelWarn})
}

// server returns the MCP server of the caller's tenant, which carries its
// sessions (the tools each may see are its view's: see intercept).
func (g *Gateway) server(r *http.Request) *sdk.Server {
	c := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	if c == nil {
		return nil
	}
	return g.shelf.server(c.Tenant)
}

func (g *Gateway) newServer() *sdk.Server {
	srv := sdk.NewServer(implementation(g.o.Version),
		&sdk.ServerOptions{
			Instructions: "Each device tool is one capability of one device of your fleet, " +
				"named {kind}-{node_id}-{capability}-{verb} ({kind}.{node_id}.{capability}.{verb} " +
				"in seed 000's dotted form, by which it may be called too).",
			// Tools, and logging: clients of the 2025 revisions set a
			// log level (logging/setLevel) and expect it accepted, though
			// okso sends no log notifications yet.
			Capabilities: &sdk.ServerCapabilities{
				Tools: &sdk.ToolCapabilities{ListChanged: true},
				//lint:ignore SA1019 deprecated from 2026-07-28, expected by the 2025 revisions' clients
				Logging: &sdk.LoggingCapabilities{},
			},
			Logger: sdkLog(g.log),
			// Tool lists are per tenant and change as devices come and go.
			SetCacheable: func(_ context.Context, _ sdk.Request, c *sdk.Cacheable) {
				c.CacheScope, c.TTLMs = "private", 0
			},
		})
	srv.AddReceivingMiddleware(g.intercept)
	return srv
}

// intercept routes every tools/call through [Gateway.call], including
// names the tenant's server does not list, so that each gets its exact
// error. The gateway serves tools only: a method of a capability it does
// not declare is not found (the SDK would answer empty lists), and a
// stateless gateway does not claim tools.listChanged on a revision whose
// clients have no stream to receive it on.
func (g *Gateway) intercept(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if r, ok := req.(*sdk.CallToolRequest); ok && method == "tools/call" {
			res, err := g.call(ctx, r)
			if tr, ok := res.(*sdk.CallToolResult); ok && err == nil {
				res = g.completed(negotiated(r.Session), tr)
			}
			return res, err
		}
		switch {
		case method == "tools/list" && g.link.isDown():
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: msgRegistryDown,
				Data: schemas.NewError(schemas.CodeInternal, msgRegistryDown).JSON()}
		case method == "tools/list":
			return g.listTools(req)
		case undeclared(method):
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "method not found: okso serves tools only"}
		}
		res, err := next(ctx, method, req)
		if err != nil {
			return res, err
		}
		switch r := res.(type) {
		case *sdk.InitializeResult:
			// A stateless session lives for one request: before 2026-07-28
			// (subscriptions/listen) nothing can carry list_changed to it.
			if !g.o.Stateful && r.Capabilities != nil && r.Capabilities.Tools != nil {
				r.Capabilities.Tools = &sdk.ToolCapabilities{ListChanged: false}
			}
		}
		return res, nil
	}
}

// completed is a tools/call result as the SDK's own tools/call leaves
// it, which the interception above goes around: content never null and,
// for a client of protocol 2026-07-28 or later, resultType "complete"
// (multi round-trip requests, SEP-2322), which such clients require of
// every result. The SDK keeps resultType unexported, and sets it when it
// decodes a result: so a completed result is a copy of one decoded
// result (g.complete) with res's fields.
func (g *Gateway) completed(version string, res *sdk.CallToolResult) *sdk.CallToolResult {
	if res.Content == nil {
		res.Content = []sdk.Content{}
	}
	if version < sessionless {
		return res
	}
	out := g.complete
	out.Meta, out.Content, out.StructuredContent, out.IsError = res.Meta, res.Content, res.StructuredContent, res.IsError
	out.InputRequests, out.RequestState = res.InputRequests, res.RequestState
	return &out
}

// negotiated returns the protocol version of a session as the SDK reads
// it for a result: a session without initialize parameters is of the
// latest version.
func negotiated(ss *sdk.ServerSession) string {
	if ss != nil {
		if p := ss.InitializeParams(); p != nil {
			return p.ProtocolVersion
		}
	}
	return sdk.SupportedProtocolVersions()[0]
}

// undeclared reports whether method belongs to a capability the gateway
// does not declare.
func undeclared(method string) bool {
	return strings.HasPrefix(method, "prompts/") || strings.HasPrefix(method, "resources/") ||
		method == "completion/complete"
}

// listTools answers tools/list from the caller's view (pages.go).
func (g *Gateway) listTools(req sdk.Request) (sdk.Result, error) {
	c := claimsOf(req.GetExtra().TokenInfo)
	if c == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "no verified token"}
	}
	var cursor string
	if p, ok := req.GetParams().(*sdk.ListToolsParams); ok && p != nil {
		cursor = p.Cursor
	}
	page, err := g.shelf.page(viewOf(c, g.form, !g.o.NoNodeTools), cursor)
	if err != nil {
		return nil, err
	}
	return page, nil
}

func trimASCII(s string, max int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < max; i++ {
		if c := s[i]; c >= 0x20 && c <= 0x7e {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// quietHandler passes on only records at or above min: the SDK logs every
// stateless request's session at Info, which would drown the audit log.
type quietHandler struct {
	slog.Handler
	min slog.Level
}

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h quietHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(a), h.min}
}

func (h quietHandler) WithGroup(n string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(n), h.min}
}
