package roles

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/oklog/run"
	"github.com/spf13/cobra"

	"github.com/okso-io/okso/auth"
)

// AllInOneConfig configures [AllInOne].
type AllInOneConfig struct {
	Gateway    gatewayConfig
	Tier       tierConfig
	NATSListen string
	DataDir    string
	Mock       int
	Seed       uint64
	Tenant     string
	// LocalAgent runs a device agent for this host.
	LocalAgent bool
	// NoAuditLog leaves audit events out of the log; they are published
	// on NATS all the same.
	NoAuditLog bool
}

// AllInOne is embedded NATS, the gateway, the device tier and simulated
// devices in one process, each part with its own NATS connection.
type AllInOne struct {
	c     *common
	nats  *natsPart
	gw    *gatewayPart
	tier  *tierPart
	fleet *fleetPart
	agent *agentPart
}

// NewAllInOne starts NATS and binds both listeners; [AllInOne.Run] serves.
func NewAllInOne(ctx context.Context, log *slog.Logger, cfg AllInOneConfig) (_ *AllInOne, err error) {
	c, err := loadCommon(log, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.noAuditLog = cfg.NoAuditLog
	a := &AllInOne{c: c}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if a.nats, err = openNATS(natsConfig{Listen: cfg.NATSListen}); err != nil {
		return nil, err
	}
	if a.tier, err = newTierPart(ctx, c, a.nats, cfg.Tier); err != nil {
		return nil, err
	}
	cfg.Gateway.Version = Version
	if a.gw, err = newGatewayPart(ctx, c, a.nats, cfg.Gateway); err != nil {
		return nil, err
	}
	if a.fleet, err = newFleetPart(c, cfg.Mock, cfg.Tenant, []string{a.tier.url()}, cfg.Seed); err != nil {
		return nil, err
	}
	if cfg.LocalAgent {
		if a.agent, err = newAgentPart(c, []string{a.tier.url()}, "", cfg.DataDir, cfg.Tenant); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// MCPURL is the agents' endpoint.
func (a *AllInOne) MCPURL() string { return a.gw.url() }

// DeviceURL is the devices' endpoint.
func (a *AllInOne) DeviceURL() string { return a.tier.url() }

// NATSURL is where other processes reach the embedded NATS ("" unless
// --nats-listen).
func (a *AllInOne) NATSURL() string { return a.nats.clientURL() }

// Signer signs tokens with the data dir's key.
func (a *AllInOne) Signer() *auth.Signer { return a.c.signer }

// Run serves until ctx ends or a part fails, then stops every part.
func (a *AllInOne) Run(ctx context.Context) error {
	defer a.close()
	var g run.Group
	g.Add(run.ContextHandler(ctx))
	// Interrupted in this order: the gateway drains its calls while the
	// devices still answer; then this process's own devices stop, so
	// that the tier's 1001 is no outage to them; then the tier.
	a.gw.actors(&g)
	a.fleet.actors(&g)
	a.agent.actors(&g)
	a.tier.actors(&g)
	err := g.Run()
	if _, ok := err.(run.SignalError); ok || err == context.Canceled {
		return nil
	}
	return err
}

func (a *AllInOne) close() {
	if a.gw != nil {
		a.gw.close()
	}
	if a.tier != nil {
		a.tier.close()
	}
	if a.nats != nil {
		a.nats.close()
	}
}

func allInOneCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfg  AllInOneConfig
		logs logFlags
		ttl  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "all-in-one",
		Short: "Run NATS, the gateway, the device tier and simulated devices in one process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logs.logger(stderr)
			if err != nil {
				return err
			}
			stop, err := logs.start(log)
			if err != nil {
				return err
			}
			defer stop()
			ctx := contextOf(cmd)
			cfg.NoAuditLog = !logs.audit
			a, err := NewAllInOne(ctx, log, cfg)
			if err != nil {
				return err
			}
			token, err := a.Signer().Mint(auth.MintOptions{
				Subject: "agent", Tenant: cfg.Tenant, Scopes: []string{auth.ScopeReadOnly}, TTL: ttl,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "okso %s all-in-one\n", Version)
			fmt.Fprintf(stdout, "  MCP endpoint : %s\n", a.MCPURL())
			fmt.Fprintf(stdout, "  device tier  : %s\n", a.DeviceURL())
			if u := a.NATSURL(); u != "" {
				fmt.Fprintf(stdout, "  NATS         : %s\n", u)
			}
			fmt.Fprintf(stdout, "  mock devices : %d (tenant %s)\n", cfg.Mock, cfg.Tenant)
			if a.agent != nil {
				fmt.Fprintf(stdout, "  this host    : node %s (okso agent)\n", a.agent.d.NodeID())
			}
			fmt.Fprintf(stdout, "  agent token  : %s\n", token)
			fmt.Fprintf(stdout, "                (tenant %s, scope %s, valid %s)\n", cfg.Tenant, auth.ScopeReadOnly, ttl)
			fmt.Fprintf(stdout, "  try it       : npx @modelcontextprotocol/inspector --cli %s --transport http "+
				"--header \"Authorization: Bearer %s\" --method tools/list\n", a.MCPURL(), token)
			return a.Run(ctx)
		},
	}
	fs := cmd.Flags()
	addGatewayFlags(fs, &cfg.Gateway)
	addTierFlags(fs, &cfg.Tier)
	fs.StringVar(&cfg.NATSListen, "nats-listen", "", "also expose the embedded NATS server on host:port (port 0: any)")
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the signing key (created on first start)")
	fs.IntVar(&cfg.Mock, "mock", 3, "number of simulated devices")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated devices' metrics")
	fs.BoolVar(&cfg.LocalAgent, "local-agent", true, "run a device agent for this host (its real metrics)")
	fs.StringVar(&cfg.Tenant, "tenant", DefaultTenant, "tenant of the simulated devices and of the printed token")
	fs.DurationVar(&ttl, "token-ttl", 24*time.Hour, "validity of the printed agent token")
	logs.add(fs)
	return cmd
}
