package roles

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
)

// gatewayPart is the agents' door.
type gatewayPart struct {
	nc      *nats.Conn
	audit   *bus.Auditor
	gw      *mcp.Gateway
	http    *httpPart
	revoked *bus.Revocations
	issuers *auth.Issuers    // nil: none
	oauth   *mcp.OAuthServer // nil without --oauth-server
	summary *callSummary
	tick    <-chan time.Time // of the summary; nil: every summaryPeriod
	drain   time.Duration    // unready but serving, before the stop
}

type gatewayConfig struct {
	AuditRetention      time.Duration // keep audit events in JetStream this long (0: do not keep)
	Addr                string
	Budget              time.Duration
	Stateful            bool
	NoFastPath          bool
	ToolNames           string // the form of listed tool names: safe or seed
	NoNodeTools         bool   // leave per-node tools out of tools/list (--node-tools=false)
	AllowedOrigins      []string
	Audience            string
	Version             string
	MaxStreamsPerTenant int
	StreamPing          time.Duration
	StreamIdle          time.Duration
	PublicURL           string
	MaxConnections      int // held by the MCP listener at once (0: no bound)
	TLS                 tlsFiles
	// OAuthIssuers is the --oauth-issuers file: the external issuers
	// whose tokens the gateway accepts beside okso's ("": none).
	OAuthIssuers string
	// CallerTimeout bounds a relayed call to a caller's tool (0: 60 s);
	// CallerLeaseTTL is the lease of a declaration, and of its claim of
	// the caller id, in okso_callers (0: 15 s): how long they outlive a
	// replica that died holding its listen.
	CallerTimeout  time.Duration
	CallerLeaseTTL time.Duration
	// FleetBudget bounds a whole fleet.call fan-out (0: 30 s).
	FleetBudget time.Duration
	// ShutdownDrain is how long a stopping gateway stays unready but
	// serving, before it stops accepting (0: it stops at once).
	ShutdownDrain time.Duration
	// SummaryTick, if set, says when to write the calls line (default:
	// every minute).
	SummaryTick <-chan time.Time
	// AuditTick, if set, ends each period of the audit log's repeats
	// (default: every --log-repeats).
	AuditTick <-chan time.Time
	// OAuth is okso's own authorization server (--oauth-server).
	OAuth oauthConfig
}

// newGatewayPart binds the MCP listener, then connects to np, opens the
// registry and the revocations and builds the gateway.
func newGatewayPart(ctx context.Context, c *common, np *natsPart, cfg gatewayConfig) (_ *gatewayPart, err error) {
	if cfg.CallerLeaseTTL != 0 && cfg.CallerLeaseTTL < time.Second {
		return nil, fmt.Errorf("--caller-lease-ttl %v: at least 1s (NATS message TTLs count whole seconds)", cfg.CallerLeaseTTL)
	}
	if cfg.CallerTimeout < 0 {
		return nil, fmt.Errorf("--caller-timeout %v: must be positive", cfg.CallerTimeout)
	}
	if cfg.FleetBudget < 0 {
		return nil, fmt.Errorf("--fleet-budget %v: must be positive", cfg.FleetBudget)
	}
	pair, err := cfg.TLS.load(c.log, "--tls")
	if err != nil {
		return nil, err
	}
	hp, err := listen("--mcp-addr", cfg.Addr, cfg.MaxConnections)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			hp.close()
		}
	}()
	if pair != nil {
		hp.serveTLS(pair, nil, "h2", "http/1.1")
	}
	hp.warnPlain(c.log.With("role", "gateway"), "agent tokens and tool calls")
	nc, err := np.connect(bus.RoleGateway, "okso-gateway")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	logAsyncErrors(c.log, nc)
	reg, err := openRegistry(ctx, c.log, nc, bus.RegistryOptions{Replicas: np.replicas, BindOnly: np.bindOnly()})
	if err != nil {
		return nil, err
	}
	remotes, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Remotes, error) {
		return bus.OpenRemotes(ctx, nc, bus.RemotesOptions{Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	callers, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Callers, error) {
		return bus.OpenCallers(ctx, nc, bus.CallersOptions{TTL: cfg.CallerLeaseTTL, Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	plans, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Plans, error) {
		return bus.OpenPlans(ctx, nc, bus.PlansOptions{Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	revoked, err := openRevocations(ctx, c.log, nc, np)
	if err != nil {
		return nil, err
	}
	kinds, err := openKinds(ctx, c.log, nc, np, c.schemas)
	if err != nil {
		return nil, err
	}
	if cfg.AuditRetention > 0 {
		if err := bus.KeepAudit(ctx, nc, cfg.AuditRetention, np.replicas, false, np.bindOnly()); errors.Is(err, bus.ErrOtherRetention) {
			c.log.Warn("--audit-retention", "err", err)
		} else if err != nil {
			return nil, err
		}
	}
	aud := cfg.Audience
	if aud == "" {
		aud = auth.AudienceGateway
	}
	var verifier mcp.TokenVerifier = c.verifier(aud)
	var issuers *auth.Issuers
	if cfg.OAuthIssuers != "" {
		var cfgs []auth.IssuerConfig
		if cfgs, err = loadIssuers(cfg.OAuthIssuers); err != nil {
			return nil, err
		}
		// Fail fast: an issuer that cannot be reached now is a wrong URL
		// more often than an outage, and a gateway that started without
		// it would refuse all its users with a reason only in 401s.
		if issuers, err = auth.NewIssuers(ctx, cfgs, auth.IssuersOptions{Logger: c.log.With("role", "gateway")}); err != nil {
			return nil, fmt.Errorf("--oauth-issuers %s: %w", cfg.OAuthIssuers, err)
		}
		defer func() {
			if err != nil {
				issuers.Close()
			}
		}()
		verifier = auth.NewTrust(c.verifier(aud), issuers)
		c.log.Info("trusting OAuth issuers", "role", "gateway", "issuers", issuers.URLs())
	}
	summary := &callSummary{log: c.log.With("role", "gateway"), period: summaryPeriod}
	audit := c.auditor(nc, cfg.AuditTick)
	c.registerPart("gateway", nc, audit, bus.BucketNodes, bus.BucketTiers, bus.BucketRemotes, bus.BucketCallers,
		bus.BucketPlans, bus.BucketRevoked, bus.BucketKinds)
	audit.Observe = summary.observe
	var oauth *mcp.OAuthServer
	if cfg.OAuth.Server {
		if oauth, err = newOAuthServer(ctx, c, nc, np, cfg.OAuth, audit); err != nil {
			return nil, err
		}
	}
	gw, err := mcp.New(mcp.Options{
		Metrics:        c.metrics,
		Tracer:         c.tracer,
		NC:             nc,
		Registry:       reg,
		Remotes:        remotes,
		Callers:        callers,
		CallerTimeout:  cfg.CallerTimeout,
		Plans:          plans,
		FleetBudget:    cfg.FleetBudget,
		Relayers:       []bus.Role{bus.RoleGateway},
		Schemas:        c.schemas,
		Verifier:       verifier,
		Auditor:        audit,
		Logger:         c.log.With("role", "gateway"),
		Budget:         cfg.Budget,
		Stateful:       cfg.Stateful,
		NoFastPath:     cfg.NoFastPath,
		ToolNames:      cfg.ToolNames,
		NoNodeTools:    cfg.NoNodeTools,
		AllowedOrigins: cfg.AllowedOrigins,
		Version:        cmp.Or(cfg.Version, Version),
		PublicURL:      cfg.PublicURL,
		Revoked:        revoked,
		Kinds:          kinds,
		OAuth:          oauth,

		AuthorizationServers: issuers.URLs(),
		MaxStreamsPerTenant:  cfg.MaxStreamsPerTenant,
		PingInterval:         cfg.StreamPing,
		IdleTimeout:          cfg.StreamIdle,
	})
	if err != nil {
		return nil, err
	}
	hp.handle(c.log.With("role", "gateway"), gw.Handler())
	audit.Start()
	return &gatewayPart{nc: nc, audit: audit, gw: gw, http: hp, revoked: revoked, issuers: issuers, oauth: oauth, drain: cfg.ShutdownDrain,
		summary: summary, tick: cfg.SummaryTick}, nil
}

func (p *gatewayPart) url() string {
	return p.http.scheme("http://", "https://") + p.http.addr() + "/mcp"
}

func (p *gatewayPart) actors(g *run.Group) {
	contextActor(g, p.gw.Run)
	if p.oauth != nil {
		contextActor(g, p.oauth.Run)
	}
	contextActor(g, func(ctx context.Context) error {
		tick := p.tick
		if tick == nil {
			t := time.NewTicker(summaryPeriod)
			defer t.Stop()
			tick = t.C
		}
		p.summary.run(ctx, tick)
		return nil
	})
	revoked := followRevocations(g, p.revoked, nil)
	// Serve once the registry is loaded, so the first tools/list is whole,
	// and the revocations, so no revoked token gets in after a restart;
	// on stop, streams get their 1000 close before the server drains.
	ready := p.gw.Ready()
	ctx, cancel := context.WithCancel(context.Background())
	g.Add(func() error {
		for _, c := range []<-chan struct{}{ready, revoked} {
			select {
			case <-c:
			case <-ctx.Done():
				return nil
			}
		}
		if err := p.http.srv.Serve(p.http.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) {
		cancel()
		if p.drain > 0 {
			// Unready, but serving: load balancers take the gateway out of
			// rotation before it stops accepting (see mcp.Gateway.Drain).
			p.gw.Drain()
			time.Sleep(p.drain)
		}
		p.gw.EndStreams()
		sctx, scancel := shutdownCtx()
		defer scancel()
		p.http.stop(sctx)
	})
}

func (p *gatewayPart) close() {
	p.audit.Close()
	p.nc.Close()
	p.issuers.Close()
}
