package roles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/oklog/run"
	"github.com/spf13/cobra"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// runGroup runs the actors until ctx ends or one returns; a cancelled ctx
// is a clean stop.
func runGroup(ctx context.Context, add func(*run.Group)) error {
	var g run.Group
	g.Add(run.ContextHandler(ctx))
	add(&g)
	err := g.Run()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// announceListeners logs where a split role listens, for operators and for
// scripts that start it on port 0.
func announceListeners(log *slog.Logger, np *natsPart, attrs ...any) {
	if np.srv != nil {
		if u := np.clientURL(); u != "" {
			attrs = append(attrs, "nats_url", u)
		}
		if u := np.srv.ClusterURL(); u != "" {
			attrs = append(attrs, "nats_route_url", u)
		}
		attrs = append(attrs, "nats_name", np.name)
		if np.store != "" {
			attrs = append(attrs, "nats_store", np.store)
		}
	}
	log.Info("listening", attrs...)
}

func gatewayCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg     gatewayConfig
		nf      natsFlags
		logs    logFlags
		dataDir string
	)
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run the agents' door: MCP over Streamable HTTP at /mcp",
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
			c, err := loadVerifier(log, dataDir)
			if err != nil {
				return err
			}
			c.noAuditLog, c.logRepeats = !logs.audit, logs.repeats
			np, err := openNATS(nf.config(dataDir, "gateway"))
			if err != nil {
				return err
			}
			defer np.close()
			cfg.Version = Version
			gp, err := newGatewayPart(ctx, c, np, cfg)
			if err != nil {
				return err
			}
			defer gp.close()
			announceListeners(log, np, "role", "gateway", "mcp_url", gp.url())
			return runGroup(ctx, gp.actors)
		},
	}
	fs := cmd.Flags()
	addGatewayFlags(fs, &cfg)
	nf.add(fs)
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "directory of the signing key, and of the embedded NATS server's store (nats/)")
	logs.add(fs)
	return cmd
}

func deviceCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg     tierConfig
		nf      natsFlags
		logs    logFlags
		dataDir string
		mock    int
		tenant  string
		seed    uint64
	)
	cmd := &cobra.Command{
		Use:   "device",
		Short: "Run the devices' door: the okso.v1 WebSocket endpoint at /v1/device/ws",
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
			load := loadVerifier
			if mock > 0 {
				load = loadCommon
			}
			c, err := load(log, dataDir)
			if err != nil {
				return err
			}
			c.noAuditLog, c.logRepeats = !logs.audit, logs.repeats
			np, err := openNATS(nf.config(dataDir, "device"))
			if err != nil {
				return err
			}
			defer np.close()
			tp, err := newTierPart(ctx, c, np, cfg)
			if err != nil {
				return err
			}
			defer tp.close()
			fleet, err := newFleetPart(c, mock, tenant, []string{tp.url()}, seed)
			if err != nil {
				return err
			}
			announceListeners(log, np, "role", "device", "device_url", tp.url())
			return runGroup(ctx, func(g *run.Group) {
				fleet.actors(g) // stopped first: the tier's 1001 is no outage to its own devices
				tp.actors(g)
			})
		},
	}
	fs := cmd.Flags()
	addTierFlags(fs, &cfg)
	nf.add(fs)
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "directory of the signing key, and of the embedded NATS server's store (nats/)")
	fs.IntVar(&mock, "mock", 0, "number of simulated devices to run against this tier")
	fs.Uint64Var(&seed, "seed", 1, "seed of the simulated devices' metrics")
	fs.StringVar(&tenant, "tenant", DefaultTenant, "tenant of the simulated devices")
	logs.add(fs)
	return cmd
}

func mockFleetCmd(stderr io.Writer) *cobra.Command {
	var (
		n       int
		urls    []string
		tenant  string
		dataDir string
		seed    uint64
		rate    int
		logs    logFlags
	)
	cmd := &cobra.Command{
		Use:   "mock-fleet",
		Short: "Run N simulated devices against a device tier",
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
			if err := checkConnect(urls); err != nil {
				return err
			}
			if n < 1 {
				return errors.New("-n must be at least 1")
			}
			c, err := loadCommon(log, dataDir)
			if err != nil {
				return err
			}
			fleet, err := newFleetPart(c, n, tenant, urls, seed)
			if err != nil {
				return err
			}
			fleet.rate = rate
			return runGroup(contextOf(cmd), fleet.actors)
		},
	}
	fs := cmd.Flags()
	fs.IntVarP(&n, "count", "n", 50, "number of simulated devices")
	fs.StringSliceVar(&urls, "connect", nil, "device tier URL, ws://HOST:PORT"+wire.Path+" (repeatable: tried in turn)")
	fs.StringVar(&tenant, "tenant", DefaultTenant, "tenant of the simulated devices")
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "directory of the signing key that mints the device tokens")
	fs.Uint64Var(&seed, "seed", 1, "seed of the simulated devices' metrics (each device walks its own way)")
	fs.IntVar(&rate, "connect-rate", 1000, "devices that start connecting per second (0: all at once)")
	logs.add(fs)
	return cmd
}

// checkConnect checks the --connect URLs of a device role.
func checkConnect(urls []string) error {
	if len(urls) == 0 {
		return errors.New("--connect is required (ws://HOST:PORT/v1/device/ws)")
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "ws://") && !strings.HasPrefix(u, "wss://") {
			return fmt.Errorf("--connect %q: want a ws:// or wss:// URL", u)
		}
	}
	return nil
}

func agentCmd(stderr io.Writer) *cobra.Command {
	var (
		urls    []string
		token   string
		tenant  string
		dataDir string
		logs    logFlags
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the device agent of this machine: echo, and its real metrics",
		Long: "okso agent dials a device tier (several --connect URLs are tried in turn, with\n" +
			"jittered exponential backoff after a loss), authenticates with --token, and serves\n" +
			"system.echo and system.metrics with this host's real figures. Without --token it\n" +
			"mints a device token with the signing key in --data-dir, for a node id it keeps there.",
		Args: cobra.NoArgs,
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
			if err := checkConnect(urls); err != nil {
				return err
			}
			c := &common{log: log}
			if c.schemas, err = schemas.Load(); err != nil {
				return err
			}
			if token == "" {
				if c.signer, err = auth.LoadOrCreateSigner(dataDir); err != nil {
					return err
				}
			}
			ap, err := newAgentPart(c, urls, token, dataDir, tenant)
			if err != nil {
				return err
			}
			return runGroup(contextOf(cmd), ap.actors)
		},
	}
	fs := cmd.Flags()
	fs.StringSliceVar(&urls, "connect", nil, "device tier URL, ws://HOST:PORT"+wire.Path+" (repeatable: tried in turn)")
	fs.StringVar(&token, "token", "", "device token (its subject is the node id)")
	fs.StringVar(&tenant, "tenant", DefaultTenant, "tenant of the minted token, without --token")
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "signing key and node id, without --token")
	logs.add(fs)
	return cmd
}

func tokenCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage okso tokens"}
	var (
		o       auth.MintOptions
		dataDir string
		isDev   bool
		nodeID  string
	)
	mint := &cobra.Command{
		Use:   "mint",
		Short: "Print a signed token: an agent token, or with --device a device token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			signer, err := auth.LoadOrCreateSigner(dataDir)
			if err != nil {
				return err
			}
			if !bus.ValidTenant(o.Tenant) {
				return fmt.Errorf("--tenant %q: use 1-64 letters, digits, _ or -", o.Tenant)
			}
			if o.TTL <= 0 {
				return fmt.Errorf("--ttl %v: a token needs a validity above zero", o.TTL)
			}
			if isDev {
				if !bus.ValidNodeID(nodeID) {
					return fmt.Errorf("--node-id %q: want a lower-case ULID (26 characters)", nodeID)
				}
				o.Subject = nodeID
				o.Scopes = []string{auth.ScopeDeviceConnect}
				if o.Audience == "" {
					o.Audience = auth.AudienceDevice
				}
			} else if !cmd.Flags().Changed("scope") {
				o.Scopes = []string{auth.ScopeReadOnly}
			}
			var scopes []string
			for _, s := range o.Scopes {
				for _, f := range strings.Fields(s) {
					if !auth.KnownScope(f) {
						return fmt.Errorf("--scope %q: want %s, %s or %s (each implies the ones before it)",
							f, auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive)
					}
					if f == auth.ScopeDeviceConnect && !isDev {
						return fmt.Errorf("--scope %s is a device token's: use --device --node-id", f)
					}
					scopes = append(scopes, f)
				}
			}
			o.Scopes = scopes
			tok, err := signer.Mint(o)
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, tok)
			return nil
		},
	}
	fs := mint.Flags()
	fs.StringVar(&o.Tenant, "tenant", DefaultTenant, "tenant of the token")
	fs.StringSliceVar(&o.Scopes, "scope", nil, "scopes (repeatable, or space separated); default tools:call:read_only")
	fs.DurationVar(&o.TTL, "ttl", time.Hour, "validity")
	fs.StringVar(&o.Subject, "subject", "agent", "subject (sub) of an agent token")
	fs.StringVar(&o.Audience, "audience", "", "audience (default okso-mcp, or okso-device with --device)")
	fs.BoolVar(&isDev, "device", false, "mint a device token (scope device:connect)")
	fs.StringVar(&nodeID, "node-id", "", "node id of a device token")
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "directory of the signing key (created if missing)")
	var rotateDir string
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Make a new signing key, keeping the old public key accepted (keys/<kid>.pub)",
		Long: "okso token rotate replaces the signing key in --data-dir and keeps the old public key\n" +
			"in --data-dir/keys, so verifiers that load it still accept tokens signed before the\n" +
			"rotation until they expire. Copy signing.pub and keys/ to the gateways and tiers and\n" +
			"restart them one by one; delete a key from keys/ once its tokens have expired.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			s, err := auth.Rotate(rotateDir)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "new signing key %s\n", s.KeyID())
			return nil
		},
	}
	rotate.Flags().StringVar(&rotateDir, "data-dir", defaultDataDir(), "directory of the signing key")
	cmd.AddCommand(mint, revokeCmd(stdout), rotate)
	return cmd
}

func revokeCmd(stdout io.Writer) *cobra.Command {
	var (
		natsURL string
		token   string
		until   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "revoke [JTI]",
		Short: "Revoke a token, by its id (jti) or whole (--token): every gateway and tier refuses it",
		Long: "okso token revoke writes the token id to the shared revocation bucket (KV okso_revoked)\n" +
			"on the NATS of your gateways and tiers (--nats-url). Within a second they refuse the token,\n" +
			"and a device whose token it is loses its session (close 4401). The revocation lasts until\n" +
			"the token would have expired (--token), or --until.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if natsURL == "" {
				return errors.New("--nats-url is required: the NATS of the gateways and tiers")
			}
			var jti string
			expires := time.Now().Add(until)
			switch {
			case token != "" && len(args) == 0:
				c, err := auth.UnverifiedClaims(token)
				if err != nil {
					return fmt.Errorf("--token: %w", err)
				}
				jti = c.ID
				if c.ExpiresAt != nil && !cmd.Flags().Changed("until") {
					expires = c.ExpiresAt.Time
				}
			case token == "" && len(args) == 1:
				jti = args[0]
			default:
				return errors.New("give a token id (jti) or --token, one of them")
			}
			nc, err := bus.ConnectURL(natsURL, "okso-token-revoke")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(contextOf(cmd), 10*time.Second)
			defer cancel()
			revs, err := bus.OpenRevocations(ctx, nc, bus.RevocationOptions{Replicas: 1})
			if err != nil {
				return err
			}
			if err := revs.Revoke(ctx, jti, expires); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "revoked %s until %s\n", jti, expires.UTC().Format(time.RFC3339))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&natsURL, "nats-url", "", "NATS of the gateways and tiers (an okso process started with --nats-listen, or your cluster)")
	fs.StringVar(&token, "token", "", "the token to revoke (its jti and expiry are read from it)")
	fs.DurationVar(&until, "until", 30*24*time.Hour, "how long the revocation lasts when the token's expiry is not known")
	return cmd
}
