package roles

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// shutdownTimeout bounds every graceful stop.
const shutdownTimeout = 5 * time.Second

func shutdownCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), shutdownTimeout)
}

// natsPart is the NATS a role uses: an embedded server, or an external one.
type natsPart struct {
	srv *bus.Server // nil when external
	url string
}

func openNATS(url, listen string) (*natsPart, error) {
	if url != "" {
		if listen != "" {
			return nil, errors.New("--nats-url and --nats-listen exclude each other")
		}
		return &natsPart{url: url}, nil
	}
	srv, err := bus.StartServer(bus.ServerOptions{Listen: listen})
	if err != nil {
		return nil, err
	}
	return &natsPart{srv: srv}, nil
}

func (p *natsPart) connect(name string) (*nats.Conn, error) {
	if p.srv != nil {
		return p.srv.Connect(name)
	}
	return bus.ConnectURL(p.url, name)
}

// clientURL is where other processes can reach this NATS ("" if nowhere).
func (p *natsPart) clientURL() string {
	if p.srv != nil {
		return p.srv.ClientURL()
	}
	return p.url
}

func (p *natsPart) close() {
	if p.srv != nil {
		p.srv.Shutdown()
	}
}

// httpPart is a bound listener and the server that will serve it.
type httpPart struct {
	ln  net.Listener
	srv *http.Server
}

func listen(addr string, h http.Handler) (*httpPart, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return &httpPart{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}, nil
}

func (p *httpPart) addr() string { return p.ln.Addr().String() }

// actor adds the server to g; before is called on interrupt, before the
// HTTP server stops accepting.
func (p *httpPart) actor(g *run.Group, before func(context.Context)) {
	g.Add(func() error {
		if err := p.srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) {
		ctx, cancel := shutdownCtx()
		defer cancel()
		if before != nil {
			before(ctx)
		}
		_ = p.srv.Shutdown(ctx)
	})
}

// contextActor runs fn with a context cancelled on interrupt.
func contextActor(g *run.Group, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	g.Add(func() error { return fn(ctx) }, func(error) { cancel() })
}

// common holds what every server role loads.
type common struct {
	log     *slog.Logger
	schemas *schemas.Set
	signer  *auth.Signer
}

func loadCommon(log *slog.Logger, dataDir string) (*common, error) {
	set, err := schemas.Load()
	if err != nil {
		return nil, err
	}
	signer, err := auth.LoadOrCreateSigner(dataDir)
	if err != nil {
		return nil, err
	}
	return &common{log: log, schemas: set, signer: signer}, nil
}

// gatewayPart is the agents' door.
type gatewayPart struct {
	nc   *nats.Conn
	gw   *mcp.Gateway
	http *httpPart
}

type gatewayConfig struct {
	Addr           string
	Budget         time.Duration
	Stateful       bool
	AllowedOrigins []string
	Audience       string
	Version        string
}

func newGatewayPart(ctx context.Context, c *common, np *natsPart, cfg gatewayConfig) (*gatewayPart, error) {
	nc, err := np.connect("okso-gateway")
	if err != nil {
		return nil, err
	}
	reg, err := bus.OpenRegistry(ctx, nc, bus.RegistryOptions{})
	if err != nil {
		nc.Close()
		return nil, err
	}
	aud := cfg.Audience
	if aud == "" {
		aud = auth.AudienceGateway
	}
	gw, err := mcp.New(mcp.Options{
		NC:             nc,
		Registry:       reg,
		Schemas:        c.schemas,
		Verifier:       auth.NewVerifier(c.signer.Public(), aud),
		Auditor:        &bus.Auditor{Log: c.log, NC: nc},
		Logger:         c.log.With("role", "gateway"),
		Budget:         cfg.Budget,
		Stateful:       cfg.Stateful,
		AllowedOrigins: cfg.AllowedOrigins,
		Version:        cfg.Version,
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	hp, err := listen(cfg.Addr, gw.Handler())
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &gatewayPart{nc: nc, gw: gw, http: hp}, nil
}

func (p *gatewayPart) url() string { return "http://" + p.http.addr() + "/mcp" }

func (p *gatewayPart) actors(g *run.Group) {
	contextActor(g, p.gw.Run)
	p.http.actor(g, nil)
}

func (p *gatewayPart) close() { p.nc.Close() }

// tierPart is the devices' door.
type tierPart struct {
	nc   *nats.Conn
	tier *device.Tier
	http *httpPart
}

type tierConfig struct {
	Addr          string
	MaxFrameBytes int
	AuthTimeout   time.Duration
	PingInterval  time.Duration
	LeaseTTL      time.Duration
}

func newTierPart(ctx context.Context, c *common, np *natsPart, cfg tierConfig) (*tierPart, error) {
	nc, err := np.connect("okso-device-tier")
	if err != nil {
		return nil, err
	}
	reg, err := bus.OpenRegistry(ctx, nc, bus.RegistryOptions{TTL: cfg.LeaseTTL})
	if err != nil {
		nc.Close()
		return nil, err
	}
	tier, err := device.NewTier(device.TierOptions{
		NC:            nc,
		Registry:      reg,
		Schemas:       c.schemas,
		Verifier:      auth.NewVerifier(c.signer.Public(), auth.AudienceDevice),
		Auditor:       &bus.Auditor{Log: c.log, NC: nc},
		Logger:        c.log.With("role", "device"),
		MaxFrameBytes: cfg.MaxFrameBytes,
		AuthTimeout:   cfg.AuthTimeout,
		PingInterval:  cfg.PingInterval,
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	hp, err := listen(cfg.Addr, tier.Handler())
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &tierPart{nc: nc, tier: tier, http: hp}, nil
}

func (p *tierPart) url() string { return "ws://" + p.http.addr() + device.Path }

func (p *tierPart) actors(g *run.Group) {
	// Devices first get 1001 so they reconnect elsewhere; then the listener stops.
	p.http.actor(g, func(ctx context.Context) { _ = p.tier.Shutdown(ctx) })
}

func (p *tierPart) close() { p.nc.Close() }

// fleetPart is a set of simulated devices.
type fleetPart struct {
	log     *slog.Logger
	devices []*device.Device
	ready   sync.WaitGroup
}

func newFleetPart(c *common, n int, tenant string, urls []string) (*fleetPart, error) {
	if !bus.ValidTenant(tenant) {
		return nil, fmt.Errorf("tenant %q: use 1-64 letters, digits, _ or -", tenant)
	}
	f := &fleetPart{log: c.log.With("role", "mock-fleet")}
	for range n {
		id := device.NewNodeID()
		tok, err := c.signer.Mint(auth.MintOptions{
			Subject: id, Tenant: tenant, Scopes: []string{auth.ScopeDeviceConnect},
			Audience: auth.AudienceDevice, TTL: 365 * 24 * time.Hour,
		})
		if err != nil {
			return nil, err
		}
		o := device.MockOptions(id, c.schemas)
		o.URLs, o.Token, o.Logger = urls, tok, f.log
		var once sync.Once
		f.ready.Add(1)
		o.OnReady = func([]string) { once.Do(f.ready.Done) }
		d, err := device.NewDevice(o)
		if err != nil {
			return nil, err
		}
		f.devices = append(f.devices, d)
	}
	return f, nil
}

func (f *fleetPart) actors(g *run.Group) {
	if len(f.devices) == 0 {
		return
	}
	contextActor(g, func(ctx context.Context) error {
		var wg sync.WaitGroup
		for _, d := range f.devices {
			wg.Go(func() {
				if err := d.Run(ctx); err != nil {
					f.log.Error("mock device stopped", "node_id", d.NodeID(), "err", err)
				}
			})
		}
		go func() {
			f.ready.Wait()
			f.log.Info("mock devices connected", "count", len(f.devices))
		}()
		wg.Wait()
		<-ctx.Done() // a device that gave up does not stop the role
		return nil
	})
}
