package mcp

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// The dashboard (DESIGN.md §11, issue 33): static files embedded in the
// binary, served at /ui/ with no token, and a small API under /ui/api/
// that takes the agents' bearer token, for what no other door serves
// (who the token is; the tenant's audit events as they come). Everything
// else the page asks through the doors agents use: POST /mcp/tools/call
// for the fleet tools, any tool, and metric streams.
//
// The page shows strings that devices, upstreams and other agents wrote,
// next to a token: it runs under a Content-Security-Policy that allows
// only its own files (no inline script, no framing, Trusted Types
// required, so an HTML sink cannot take a string), and writes data as
// text nodes only (TestDashboardNoHTMLSinks holds its files to that).

// uiFiles are the dashboard's files: plain HTML, CSS and JavaScript
// modules, no build step. (A package-level variable because go:embed
// needs one.)
//
//go:embed ui
var uiFiles embed.FS

// uiPolicy is the Content-Security-Policy of every /ui/ answer.
const uiPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

// auditFeedBuffer bounds the events a feed holds for a slow page; more
// are dropped and counted (an event "dropped" tells the page how many).
const auditFeedBuffer = 256

// ScopeAuditFeed is the scope the dashboard's audit feed needs: any
// agent token of the tenant may read its tenant's audit events (they
// never carry arguments or results), the weakest call scope and those
// that imply it.
const ScopeAuditFeed = auth.ScopeReadOnly

// dashboard serves /ui/. Its audit feeds hold one of their tenant's
// stream slots each (--max-streams-per-tenant) and end when the gateway
// stops (endAll). It is safe for concurrent use.
type dashboard struct {
	files       fs.FS // uiFiles' ui directory
	nc          *nats.Conn
	streams     *streams
	ping, idle  time.Duration
	stopOnce    sync.Once
	stop        chan struct{} // closed by endAll
	feedsOpen   atomic.Int64
	feedDropped atomic.Int64
}

func newDashboard(g *Gateway) (*dashboard, error) {
	files, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		return nil, fmt.Errorf("dashboard files: %w", err)
	}
	return &dashboard{files: files, nc: g.o.NC, streams: g.streams, ping: g.o.PingInterval, idle: g.o.IdleTimeout,
		stop: make(chan struct{})}, nil
}

// register adds the dashboard's metrics to reg (nil: none).
func (d *dashboard) register(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "okso_gateway_audit_feeds",
			Help: "Dashboard audit feeds the gateway holds open."}, func() float64 { return float64(d.feedsOpen.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "okso_gateway_audit_feed_dropped_total",
			Help: "Audit events dropped for a dashboard that did not keep up."}, func() float64 { return float64(d.feedDropped.Load()) }),
	)
}

// endAll ends every audit feed: the gateway is stopping.
func (d *dashboard) endAll() { d.stopOnce.Do(func() { close(d.stop) }) }

// uiRoutes adds the dashboard to mux: its files, and its API behind the
// same origin check and authentication as /mcp.
func (g *Gateway) uiRoutes(mux *http.ServeMux, cop *http.CrossOriginProtection) {
	static := http.StripPrefix("/ui/", http.FileServerFS(g.ui.files))
	mux.Handle("GET /ui/", uiHeaders(static, "no-cache"))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusFound))
	mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
	api := func(h http.HandlerFunc) http.Handler {
		return uiHeaders(cop.Handler(g.gate.authenticate(h)), "no-store")
	}
	mux.Handle("POST /ui/api/whoami", api(serveWhoami))
	mux.Handle("POST /ui/api/audit", api(g.ui.serveAudit))
}

// uiHeaders sets the dashboard's security headers on every answer.
func uiHeaders(next http.Handler, cache string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", uiPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Set("Cache-Control", cache)
		next.ServeHTTP(w, r)
	})
}

// whoami is what POST /ui/api/whoami says of the caller's token.
type whoami struct {
	Tenant    string    `json:"tenant"`
	Subject   string    `json:"subject"`
	Scopes    []string  `json:"scopes"`
	ExpiresAt time.Time `json:"expires_at"`
	// AuditFeed says whether the token may read the audit feed.
	AuditFeed bool `json:"audit_feed"`
}

// serveWhoami answers who the bearer token is: the page's sign-in check.
func serveWhoami(w http.ResponseWriter, r *http.Request) {
	c := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	if c == nil {
		writeError(w, http.StatusUnauthorized, schemas.NewError(schemas.CodeSafetyDenied, "no verified token"))
		return
	}
	who := whoami{Tenant: c.Tenant, Subject: c.Subject, Scopes: c.Scopes(), AuditFeed: c.HasScope(ScopeAuditFeed)}
	if c.ExpiresAt != nil {
		who.ExpiresAt = c.ExpiresAt.Time
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(who)
}

// serveAudit is POST /ui/api/audit: the caller's tenant's audit events as
// they come, as Server-Sent Events (event "audit", data one event;
// "ping" every PingInterval; "dropped" with a count when the page fell
// behind). Only the token's own tenant's subject is followed, and an
// event naming another tenant is dropped. A page that makes no read
// progress for IdleTimeout is cut off.
func (d *dashboard) serveAudit(w http.ResponseWriter, r *http.Request) {
	c := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	if c == nil || !c.HasScope(ScopeAuditFeed) {
		writeError(w, http.StatusForbidden, schemas.NewError(schemas.CodeSafetyDenied,
			"the audit feed needs scope "+ScopeAuditFeed))
		return
	}
	if !accepts(r, "text/event-stream", false) {
		writeError(w, http.StatusNotAcceptable, schemas.NewError(schemas.CodeBadRequest, "the audit feed needs Accept: text/event-stream"))
		return
	}
	if !d.streams.take(c.Tenant) {
		writeError(w, http.StatusTooManyRequests, schemas.NewError(schemas.CodeRateLimited, "the tenant holds as many streams as it may"))
		return
	}
	defer d.streams.release(c.Tenant)
	tenant := c.Tenant
	events := make(chan []byte, auditFeedBuffer)
	var dropped atomic.Int64
	sub, err := d.nc.Subscribe(bus.Audit(tenant), func(m *nats.Msg) {
		if bus.FromJetStream(m) { // a reflection, not a role's event
			return
		}
		b, ok := auditFor(tenant, m.Data)
		if !ok {
			return
		}
		select {
		case events <- b:
		default:
			dropped.Add(1)
			d.feedDropped.Add(1)
		}
	})
	if err == nil {
		err = d.nc.FlushTimeout(5 * time.Second)
	}
	if err != nil {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		writeError(w, http.StatusInternalServerError, schemas.NewError(schemas.CodeInternal, "message bus unavailable"))
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	d.feedsOpen.Add(1)
	defer d.feedsOpen.Add(-1)

	out := newSSESink(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ctx := r.Context()
	send := func(event string, data []byte) bool {
		_ = out.setWriteDeadline(time.Now().Add(d.idle))
		return out.send(ctx, event, data) == nil
	}
	ready, _ := json.Marshal(map[string]string{"tenant": tenant})
	if !send("ready", ready) {
		return
	}
	ping := time.NewTicker(d.ping)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.stop:
			_ = send("close", closeData(bus.StreamNormal))
			return
		case <-ping.C:
			if !send("ping", []byte("{}")) {
				return
			}
		case b := <-events:
			if n := dropped.Swap(0); n > 0 && !send("dropped", []byte(`{"count":`+strconv.FormatInt(n, 10)+`}`)) {
				return
			}
			if !send("audit", b) {
				return
			}
		}
	}
}

// auditFor returns the event in data as the feed of tenant sends it: an
// audit event of that tenant, re-encoded from its known fields (nothing
// else a publisher added), on one line; false for anything else.
func auditFor(tenant string, data []byte) ([]byte, bool) {
	var e bus.AuditEvent
	if json.Unmarshal(data, &e) != nil || e.Tenant != tenant {
		return nil, false
	}
	b, err := json.Marshal(e)
	return b, err == nil
}
