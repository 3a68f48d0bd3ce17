package roles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/certfile"
)

// tierPart is the devices' door.
type tierPart struct {
	nc      *nats.Conn
	audit   *bus.Auditor
	tier    *tier.Tier
	http    *httpPart
	revoked *bus.Revocations
	kinds   *bus.Kinds
	// table is the kind table announces are projected with, as the
	// follower of kinds last made it.
	table kindTable
}

type tierConfig struct {
	Addr string
	TLS  tlsFiles
	// ClientCA, if set, turns on device mTLS (--client-ca): a PEM bundle
	// of the CAs that sign devices' client certificates.
	ClientCA          string
	MaxFrameBytes     int
	AuthTimeout       time.Duration
	PingInterval      time.Duration
	PingTimeout       time.Duration
	LeaseTTL          time.Duration
	OfflineRetention  time.Duration
	ConnRatePerIP     float64
	ConnBurstPerIP    int
	MaxSessions       int
	MaxHandshakes     int
	MaxPendingPerNode int
	MaxConnections    int // held by the device listener at once (0: MaxSessions + deviceConnSlack)
	NodeBindingTTL    time.Duration
	MaxToolsPerTenant int
	MaxClockSkew      time.Duration
	// NodeLabels is the --node-labels file: the operator's names and
	// labels of nodes ([loadNodeLabels]).
	NodeLabels string
	// AuditTick, if set, ends each period of the audit log's repeats
	// (default: every --log-repeats).
	AuditTick <-chan time.Time
}

// deviceConnSlack is how many connections beyond --max-sessions the
// device listener holds by default: those the tier is refusing (4429),
// authenticating, or replacing.
const deviceConnSlack = 1024

// newTierPart binds the device listener, then connects to np, opens the
// registry, the revocations and the node bindings and builds the tier.
func newTierPart(ctx context.Context, c *common, np *natsPart, cfg tierConfig) (_ *tierPart, err error) {
	nodes, err := loadNodeLabels(cfg.NodeLabels)
	if err != nil {
		return nil, err
	}
	maxConns := cfg.MaxConnections
	if maxConns == 0 && cfg.MaxSessions > 0 {
		maxConns = cfg.MaxSessions + deviceConnSlack
	}
	pair, err := cfg.TLS.load(c.log, "--tls")
	if err != nil {
		return nil, err
	}
	var clientCAs *certfile.Bundle
	if cfg.ClientCA != "" {
		if pair == nil {
			return nil, errors.New("--client-ca needs --tls-cert and --tls-key: device mTLS is TLS first")
		}
		if clientCAs, err = certfile.LoadBundle(cfg.ClientCA, c.log); err != nil {
			return nil, fmt.Errorf("--client-ca: %w", err)
		}
	}
	hp, err := listen("--device-addr", cfg.Addr, maxConns)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			hp.close()
		}
	}()
	if pair != nil {
		// HTTP/1.1 alone: the WebSocket upgrade needs it.
		hp.serveTLS(pair, clientCAs, "http/1.1")
	}
	hp.warnPlain(c.log.With("role", "device"), "device tokens, tool calls and their results")
	nc, err := np.connect(bus.RoleDevice, "okso-device-tier")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	logAsyncErrors(c.log, nc)
	logNATSLink(c.log.With("role", "device"), nc)
	reg, err := openRegistry(ctx, c.log, nc, bus.RegistryOptions{TTL: cfg.LeaseTTL, OfflineRetention: cfg.OfflineRetention, Replicas: np.replicas, BindOnly: np.bindOnly()})
	if err != nil {
		return nil, err
	}
	revoked, err := openRevocations(ctx, c.log, nc, np)
	if err != nil {
		return nil, err
	}
	if cfg.NodeBindingTTL != 0 && cfg.NodeBindingTTL < time.Second {
		return nil, fmt.Errorf("--node-binding-ttl %v: at least 1s (NATS message TTLs count whole seconds)", cfg.NodeBindingTTL)
	}
	bindings, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Bindings, error) {
		return bus.OpenBindings(ctx, nc, bus.BindingsOptions{TTL: cfg.NodeBindingTTL, Replicas: np.replicas, Registry: reg,
			BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	kinds, err := openKinds(ctx, c.log, nc, np, c.schemas)
	if err != nil {
		return nil, err
	}
	part := &tierPart{kinds: kinds}
	audit := c.auditor(nc, cfg.AuditTick)
	c.registerPart("tier", nc, audit, bus.BucketNodes, bus.BucketTiers, bus.BucketNodeTenants, bus.BucketRevoked, bus.BucketKinds)
	tier, err := tier.New(tier.Options{
		Metrics:     c.metrics,
		Tracer:      c.tracer,
		Kinds:       part.table.Load,
		Requesters:  []bus.Role{bus.RoleGateway},
		Revoked:     revoked,
		Bindings:    bindings,
		ClientCerts: clientCAs != nil,

		MaxToolsPerTenant: cfg.MaxToolsPerTenant,
		MaxClockSkew:      cfg.MaxClockSkew,
		Nodes:             nodes,

		ConnRatePerIP:     cfg.ConnRatePerIP,
		ConnBurstPerIP:    cfg.ConnBurstPerIP,
		MaxSessions:       cfg.MaxSessions,
		MaxHandshakes:     cfg.MaxHandshakes,
		MaxPendingPerNode: cfg.MaxPendingPerNode,
		NC:                nc,
		Registry:          reg,
		Schemas:           c.schemas,
		Verifier:          c.verifier(auth.AudienceDevice),
		Auditor:           audit,
		Logger:            c.log.With("role", "device"),
		MaxFrameBytes:     cfg.MaxFrameBytes,
		AuthTimeout:       cfg.AuthTimeout,
		PingInterval:      cfg.PingInterval,
		PingTimeout:       cfg.PingTimeout,
	})
	if err != nil {
		return nil, err
	}
	hp.handle(c.log.With("role", "device"), tier.Handler())
	audit.Start()
	part.nc, part.audit, part.tier, part.http, part.revoked = nc, audit, tier, hp, revoked
	return part, nil
}

func (p *tierPart) url() string { return p.http.scheme("ws://", "wss://") + p.http.addr() + wire.Path }

// ownTLS is the TLS config of this process's own devices dialling p:
// they trust its certificate alone (nil when p is plain).
func (p *tierPart) ownTLS() *tls.Config {
	if p.http.pair == nil {
		return nil
	}
	return p.http.pair.PinnedClient()
}

func (p *tierPart) actors(g *run.Group) {
	// A revoked device token loses its live sessions too.
	revoked := followRevocations(g, p.revoked, p.tier.Revoke)
	// Announces are projected with the registered kinds: none is served
	// before they are in.
	kinds := followKinds(g, p.kinds, &p.table)
	// Devices first get 1001 so they reconnect elsewhere; then the listener
	// stops. Devices are served once the revocations are loaded: the
	// listener holds them until then.
	p.http.actor(g, func(ctx context.Context) {
		if err := p.tier.Shutdown(ctx); err != nil {
			p.http.log.Warn("device tier: sessions still open at the stop", "err", err)
		}
	}, revoked, kinds)
}

func (p *tierPart) close() {
	p.audit.Close()
	p.nc.Close()
}
