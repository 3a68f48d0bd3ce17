package roles

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/run"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/child"
	"github.com/okso-io/okso/remote"
)

// remoteConfig configures the remote tier part: okso remote's flags, and
// all-in-one's --remotes.
type remoteConfig struct {
	// Config is the upstreams' config file (DESIGN.md §9.1); empty: none
	// (all-in-one without --remotes, unless MCP_ENDPOINT is set).
	Config       string
	LeaseTTL     time.Duration
	MaxClockSkew time.Duration
	// AuditTick, if set, ends each period of the audit log's repeats.
	AuditTick <-chan time.Time
}

func addRemoteFlags(fs *pflag.FlagSet, c *remoteConfig) {
	fs.DurationVar(&c.LeaseTTL, "remote-lease-ttl", 15*time.Second, "lease of an upstream's record in okso_remotes: how long its tools stay listed after the last replica serving it stopped refreshing it (at least 1s)")
	fs.DurationVar(&c.MaxClockSkew, "remote-max-clock-skew", 250*time.Millisecond, "how far a gateway's clock may be from this host's when a call's absolute deadline is read")
}

// remotePart is the remote tier: the upstreams' door.
type remotePart struct {
	nc    *nats.Conn
	audit *bus.Auditor
	tier  *remote.Tier
}

// newRemotePart loads the config (a start-up error names the line), then
// connects to np, opens okso_remotes and builds the tier. With no config
// file and no MCP_ENDPOINT it returns nil: there is nothing to federate.
func newRemotePart(ctx context.Context, c *common, np *natsPart, cfg remoteConfig, flag string) (_ *remotePart, err error) {
	var conf *remote.Config
	if cfg.Config != "" {
		conf, err = remote.Load(cfg.Config, os.LookupEnv)
	} else {
		conf, err = remote.Load("", os.LookupEnv) // MCP_ENDPOINT only
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if len(conf.Upstreams) == 0 && cfg.Config == "" {
		return nil, nil
	}
	if cfg.LeaseTTL != 0 && cfg.LeaseTTL < time.Second {
		return nil, fmt.Errorf("--remote-lease-ttl %v: at least 1s (NATS message TTLs count whole seconds)", cfg.LeaseTTL)
	}
	// Before any upstream starts: the processes its helpers leave behind,
	// out of its process group, come to okso (Linux), to be reaped and
	// ended with it, not to init.
	if err := child.BecomeSubreaper(); err != nil {
		c.log.Warn("the upstreams' orphans go to init, not to okso", "err", err)
	}
	nc, err := np.connect(bus.RoleRemote, "okso-remote")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	logAsyncErrors(c.log, nc)
	logNATSLink(c.log.With("role", "remote"), nc)
	remotes, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Remotes, error) {
		return bus.OpenRemotes(ctx, nc, bus.RemotesOptions{TTL: cfg.LeaseTTL, Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	audit := c.auditor(nc, cfg.AuditTick)
	c.registerPart("remote", nc, audit)
	tier, err := remote.New(remote.Options{
		Tracer:       c.tracer,
		Metrics:      c.metrics,
		Requesters:   []bus.Role{bus.RoleGateway, bus.RoleRemote}, // a replica probes the others
		NC:           nc,
		Remotes:      remotes,
		Config:       conf,
		Auditor:      audit,
		Logger:       c.log.With("role", "remote"),
		MaxClockSkew: cfg.MaxClockSkew,
	})
	if err != nil {
		return nil, err
	}
	audit.Start()
	return &remotePart{nc: nc, audit: audit, tier: tier}, nil
}

// actors adds the tier to g, with the reaper of its upstreams' orphans,
// which ends those left once the tier has stopped its upstreams; p may be
// nil.
func (p *remotePart) actors(g *run.Group) {
	if p == nil {
		return
	}
	contextActor(g, func(ctx context.Context) error {
		rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		reaped := make(chan struct{})
		go func() {
			defer close(reaped)
			_ = child.ReapOrphans(rctx)
		}()
		defer func() { stop(); <-reaped }()
		return p.tier.Run(ctx)
	})
}

func (p *remotePart) close() {
	if p == nil {
		return
	}
	p.audit.Close()
	p.nc.Close()
}

// RemoteConfig configures [NewRemote]: okso remote's flags.
type RemoteConfig struct {
	Remote  remoteConfig
	NATS    natsConfig
	DataDir string
	auditLog
	telemetry
}

// Remote is okso remote, the federated upstreams' door, on its NATS.
type Remote struct {
	nats   *natsPart
	remote *remotePart
}

// NewRemote loads the config, starts (or connects to) its NATS and opens
// what the tier needs; [Remote.Run] serves. It fails, saying why, when
// the config is wrong or it cannot start within startTimeout (12 s).
func NewRemote(ctx context.Context, log *slog.Logger, cfg RemoteConfig) (_ *Remote, err error) {
	ctx, cancel := startContext(ctx)
	defer cancel()
	if cfg.Remote.Config == "" {
		return nil, fmt.Errorf("--config: the upstreams' config file is required")
	}
	c := &common{log: log, audit: cfg.auditLog, metrics: cfg.Metrics, tracer: cfg.Tracer}
	r := &Remote{}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	cfg.NATS.DataDir, cfg.NATS.Role, cfg.NATS.Log = cfg.DataDir, "remote", log
	if r.nats, err = openNATS(ctx, cfg.NATS); err != nil {
		return nil, err
	}
	if r.remote, err = newRemotePart(ctx, c, r.nats, cfg.Remote, "--config"); err != nil {
		return nil, err
	}
	return r, nil
}

// Run serves until ctx ends or the tier fails, then stops.
func (r *Remote) Run(ctx context.Context) error {
	defer r.close()
	return runGroup(ctx, r.remote.actors)
}

func (r *Remote) close() {
	r.remote.close()
	if r.nats != nil {
		r.nats.close()
	}
}

func remoteCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg  RemoteConfig
		logs logFlags
	)
	cmd := &cobra.Command{
		Use:     "remote",
		Example: "  # Federate the MCP servers of remotes.yaml through a cluster's NATS\n  okso remote --config remotes.yaml --nats-url nats://nats:4222 --nats-nkey remote.nk --data-dir ./keys",
		Short:   "Run the remote tier: federate the MCP servers and action endpoints of --config as tools",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(contextOf(cmd), stderr, &logs, func(ctx context.Context, log *slog.Logger, tel telemetry) (func(context.Context) error, error) {
				cfg.auditLog, cfg.telemetry = logs.auditLog(), tel
				r, err := NewRemote(ctx, log, cfg)
				if err != nil {
					return nil, err
				}
				announceListeners(log, r.nats, tel.listening("role", "remote", "upstreams", len(r.remote.tier.Upstreams()))...)
				return r.Run, nil
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.Remote.Config, "config", "", "the upstreams' config file (YAML; see README, Bring your own MCP servers)")
	addRemoteFlags(fs, &cfg.Remote)
	addNATSFlags(fs, &cfg.NATS)
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the embedded NATS server's store (nats/), when it runs one")
	logs.add(fs)
	return cmd
}

func endpointCmd(stdout io.Writer) *cobra.Command {
	var o remote.EndpointOptions
	cmd := &cobra.Command{
		Use:   "endpoint",
		Short: "Answer one seed-002 action request (list_tools, describe_tool, call_tool) from stdin, for the tools --token may call",
		Long: "okso endpoint reads one JSON request on stdin and writes one JSON answer on stdout:\n" +
			`  echo '{"action":"list_tools"}' | okso endpoint --url http://127.0.0.1:8080/mcp --token "$T"` + "\n" +
			`  echo '{"action":"call_tool","tool":"sysecho-<node>-echo-invoke","arguments":{"message":"hi"}}' | okso endpoint ...` + "\n" +
			"Answers are {\"type\":\"result\",...} or {\"type\":\"error\",\"error\":{name,category,message}}.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Token == "" {
				return fmt.Errorf("--token (or OKSO_TOKEN): an agent token is required")
			}
			o.Version = Version
			return remote.ServeEndpoint(contextOf(cmd), o, cmd.InOrStdin(), stdout)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.URL, "url", "http://"+DefaultMCPAddr+"/mcp", "the gateway's MCP endpoint")
	fs.StringVar(&o.Token, "token", "", "agent token (okso token mint), sent as a bearer token")
	return cmd
}
