package roles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

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

// GatewayConfig configures [NewGateway]: okso gateway's flags.
type GatewayConfig struct {
	Gateway gatewayConfig
	NATS    natsConfig
	DataDir string
	auditLog
	telemetry
}

// Gateway is okso gateway, the agents' door, on its NATS.
type Gateway struct {
	nats *natsPart
	gw   *gatewayPart
}

// NewGateway starts (or connects to) its NATS, binds the MCP listener
// and loads what the gateway needs; [Gateway.Run] serves. A gateway only
// verifies tokens: the data dir's signing.pub is enough. It fails, saying
// why, when it cannot start within startTimeout (12 s).
func NewGateway(ctx context.Context, log *slog.Logger, cfg GatewayConfig) (_ *Gateway, err error) {
	ctx, cancel := startContext(ctx)
	defer cancel()
	c, err := loadVerifier(log, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.audit, c.metrics, c.tracer = cfg.auditLog, cfg.Metrics, cfg.Tracer
	g := &Gateway{}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	cfg.NATS.DataDir, cfg.NATS.Role, cfg.NATS.Log = cfg.DataDir, "gateway", log
	cfg.NATS.AuditRetention = cfg.Gateway.AuditRetention
	if g.nats, err = openNATS(ctx, cfg.NATS); err != nil {
		return nil, err
	}
	if g.gw, err = newGatewayPart(ctx, c, g.nats, cfg.Gateway); err != nil {
		return nil, err
	}
	return g, nil
}

// MCPURL is the agents' endpoint.
func (g *Gateway) MCPURL() string { return g.gw.url() }

// Run serves until ctx ends or a part fails, then stops every part.
func (g *Gateway) Run(ctx context.Context) error {
	defer g.close()
	return runGroup(ctx, g.gw.actors)
}

func (g *Gateway) close() {
	if g.gw != nil {
		g.gw.close()
	}
	if g.nats != nil {
		g.nats.close()
	}
}

// gatewayGCPercent is okso gateway's GOGC unless the variable is set. A
// gateway's heap is mostly its catalog, an entry for every node of the
// fleet, and Go's default (100) lets the heap grow by as much again
// before a collection: at 10,000 nodes the gateway took 2.3 KB of RSS a
// node for 1.05 to 1.3 KB live (make scale, make gateway-memory). The
// collections it adds come with calls, each marking the catalog once more.
const gatewayGCPercent = 50

func gatewayCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg  GatewayConfig
		logs logFlags
	)
	cmd := &cobra.Command{
		Use:     "gateway",
		Example: "  # Agents' door on :8080, on a NATS cluster, metrics on the pod's address\n  okso gateway --mcp-addr 0.0.0.0:8080 --nats-url nats://nats:4222 --nats-nkey gateway.nk \\\n    --data-dir ./keys --metrics-addr \"$POD_IP:9464\"",
		Short:   "Run the agents' door: MCP over Streamable HTTP at /mcp",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, set := os.LookupEnv("GOGC"); !set {
				debug.SetGCPercent(gatewayGCPercent)
			}
			return serve(contextOf(cmd), stderr, &logs, func(ctx context.Context, log *slog.Logger, tel telemetry) (func(context.Context) error, error) {
				cfg.auditLog, cfg.telemetry = logs.auditLog(), tel
				g, err := NewGateway(ctx, log, cfg)
				if err != nil {
					return nil, err
				}
				announceListeners(log, g.nats, tel.listening("role", "gateway", "mcp_url", g.MCPURL())...)
				return g.Run, nil
			})
		},
	}
	fs := cmd.Flags()
	addGatewayFlags(fs, &cfg.Gateway)
	addOAuthFlags(fs, &cfg.Gateway.OAuth, false)
	addTLSFlags(fs, &cfg.Gateway.TLS, "the MCP endpoint (https://)")
	addNATSFlags(fs, &cfg.NATS)
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the signing key, and of the embedded NATS server's store (nats/)")
	logs.add(fs)
	return cmd
}

// DeviceTierConfig configures [NewDeviceTier]: okso device's flags.
type DeviceTierConfig struct {
	Tier    tierConfig
	NATS    natsConfig
	DataDir string
	// Mock simulated devices run against the tier, of Tenant, their
	// metrics seeded by Seed.
	Mock   int
	Tenant string
	Seed   uint64
	auditLog
	telemetry
}

// DeviceTier is okso device, the devices' door, on its NATS, with the
// simulated devices of --mock.
type DeviceTier struct {
	nats  *natsPart
	tier  *tierPart
	fleet *fleetPart
}

// NewDeviceTier starts (or connects to) its NATS, binds the device
// listener and loads what the tier needs; [DeviceTier.Run] serves. A
// tier only verifies tokens, unless it mints its mock devices' tokens:
// then it needs the data dir's signing key. It fails, saying why, when
// it cannot start within startTimeout (12 s).
func NewDeviceTier(ctx context.Context, log *slog.Logger, cfg DeviceTierConfig) (_ *DeviceTier, err error) {
	if cfg.Tier.ClientCA != "" && cfg.Mock > 0 {
		return nil, errors.New(ownDevicesMTLS + " (--mock 0): run them apart, with --client-cert")
	}
	ctx, cancel := startContext(ctx)
	defer cancel()
	load := loadVerifier
	if cfg.Mock > 0 {
		load = loadCommon
	}
	c, err := load(log, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.audit, c.metrics, c.tracer = cfg.auditLog, cfg.Metrics, cfg.Tracer
	d := &DeviceTier{}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	cfg.NATS.DataDir, cfg.NATS.Role, cfg.NATS.Log = cfg.DataDir, "device", log
	if d.nats, err = openNATS(ctx, cfg.NATS); err != nil {
		return nil, err
	}
	if d.tier, err = newTierPart(ctx, c, d.nats, cfg.Tier); err != nil {
		return nil, err
	}
	if d.fleet, err = newFleetPart(c, fleetDevice, cfg.Mock, cfg.Tenant, []string{d.tier.url()}, &fleetOptions{TLS: d.tier.ownTLS()}, cfg.Seed); err != nil {
		return nil, err
	}
	return d, nil
}

// DeviceURL is the devices' endpoint.
func (d *DeviceTier) DeviceURL() string { return d.tier.url() }

// Run serves until ctx ends or a part fails, then stops every part.
func (d *DeviceTier) Run(ctx context.Context) error {
	defer d.close()
	// The fleet is stopped first: the tier's 1001 is no outage to its own
	// devices.
	return runGroup(ctx, d.fleet.actors, d.tier.actors)
}

func (d *DeviceTier) close() {
	if d.tier != nil {
		d.tier.close()
	}
	if d.nats != nil {
		d.nats.close()
	}
}

// deviceGCPercent is okso device's GOGC unless the variable is set. A
// tier's heap is mostly its sessions' long-lived state, and Go's default
// (100) lets the heap grow by as much again before a collection: the
// memory of as many devices again. At 50, 10,000 devices took 34 KB per
// connection rather than 42 (make scale); the collections it adds come
// with calls, whose garbage is small next to that state.
const deviceGCPercent = 50

func deviceCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg  DeviceTierConfig
		logs logFlags
	)
	cmd := &cobra.Command{
		Use:     "device",
		Example: "  # Device tier on :8081 with its own embedded NATS exposed to a gateway\n  okso device --device-addr 0.0.0.0:8081 --nats-listen 127.0.0.1:4222 --data-dir ./keys",
		Short:   "Run the devices' door: the okso.v1 WebSocket endpoint at /v1/device/ws",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, set := os.LookupEnv("GOGC"); !set {
				debug.SetGCPercent(deviceGCPercent)
			}
			return serve(contextOf(cmd), stderr, &logs, func(ctx context.Context, log *slog.Logger, tel telemetry) (func(context.Context) error, error) {
				cfg.auditLog, cfg.telemetry = logs.auditLog(), tel
				d, err := NewDeviceTier(ctx, log, cfg)
				if err != nil {
					return nil, err
				}
				announceListeners(log, d.nats, tel.listening("role", "device", "device_url", d.DeviceURL())...)
				return d.Run, nil
			})
		},
	}
	fs := cmd.Flags()
	addTierFlags(fs, &cfg.Tier)
	addTLSFlags(fs, &cfg.Tier.TLS, "the device tier (wss://)")
	fs.StringVar(&cfg.Tier.ClientCA, "client-ca", "", clientCAUsage+"; needs --mock 0")
	addNATSFlags(fs, &cfg.NATS)
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the signing key, and of the embedded NATS server's store (nats/)")
	fs.IntVar(&cfg.Mock, "mock", 0, "number of simulated devices to run against this tier")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated devices' metrics and node ids (the same at each start on one --data-dir and --seed; fleets sharing a data dir need different seeds)")
	fs.StringVar(&cfg.Tenant, "tenant", DefaultTenant, "tenant of the simulated devices")
	logs.add(fs)
	return cmd
}

// MockFleetConfig configures [NewMockFleet]: okso mock-fleet's flags.
type MockFleetConfig struct {
	Count   int      // devices
	Connect []string // device tier URLs, tried in turn
	Tenant  string
	DataDir string // of the signing key that mints the devices' tokens
	Seed    uint64
	Rate    int // devices that start dialling per second (0: all at once)
	// Source is the local IP address the devices dial from ("": the
	// system's choice), --source-addr.
	Source string
	// TLS: --ca, and the client certificate of --client-cert, for a tier
	// that asks for one. A certificate is one node's: with it, Count must
	// be 1 and the device is the certificate's node.
	TLS clientFiles
	// Tools is a YAML file of local tools every device serves (--tools).
	Tools string
}

// MockFleet is okso mock-fleet: simulated devices dialling a device tier.
type MockFleet struct{ fleet *fleetPart }

// NewMockFleet mints the devices' tokens; [MockFleet.Run] runs them.
func NewMockFleet(log *slog.Logger, cfg MockFleetConfig) (*MockFleet, error) {
	if err := checkConnect(cfg.Connect); err != nil {
		return nil, err
	}
	if cfg.Count < 1 {
		return nil, errors.New("-n must be at least 1")
	}
	c, err := loadCommon(log, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	pair, err := cfg.TLS.loadPair(log)
	if err != nil {
		return nil, err
	}
	var ids []string
	if pair != nil {
		if cfg.Count != 1 {
			return nil, fmt.Errorf("--client-cert with -n %d: a client certificate is one node's, so -n must be 1 (run one mock-fleet per certificate)", cfg.Count)
		}
		id, err := certNode(pair, cfg.TLS.Cert)
		if err != nil {
			return nil, err
		}
		ids = []string{id}
	}
	tlsConf, err := cfg.TLS.clientTLS(pair)
	if err != nil {
		return nil, err
	}
	dial := &fleetOptions{TLS: tlsConf}
	if cfg.Source != "" {
		if dial.Source = net.ParseIP(cfg.Source); dial.Source == nil {
			return nil, fmt.Errorf("--source-addr %q: want an IP address of this host, such as 127.0.0.2", cfg.Source)
		}
	}
	if cfg.Tools != "" {
		if dial.Tools, err = agent.LoadTools(cfg.Tools); err != nil {
			return nil, err
		}
	}
	fleet, err := newFleetPart(c, fleetMock, cfg.Count, cfg.Tenant, cfg.Connect, dial, cfg.Seed, ids...)
	if err != nil {
		return nil, err
	}
	fleet.rate = cfg.Rate
	return &MockFleet{fleet: fleet}, nil
}

// Run runs the devices until ctx ends.
func (m *MockFleet) Run(ctx context.Context) error { return runGroup(ctx, m.fleet.actors) }

func mockFleetCmd(stderr io.Writer) *cobra.Command {
	var (
		cfg  MockFleetConfig
		urls []string
		logs logFlags
	)
	cmd := &cobra.Command{
		Use:     "mock-fleet",
		Example: "  # 1,000 simulated devices against a tier, 200 connecting a second\n  okso mock-fleet -n 1000 --connect ws://127.0.0.1:8081/v1/device/ws --connect-rate 200\n  # Each with this file's local tools\n  okso mock-fleet -n 10 --connect ws://127.0.0.1:8081/v1/device/ws --tools tools.yaml",
		Short:   "Run N simulated devices against a device tier",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(contextOf(cmd), stderr, &logs, func(_ context.Context, log *slog.Logger, _ telemetry) (func(context.Context) error, error) {
				cfg.Connect = urls
				m, err := NewMockFleet(log, cfg)
				if err != nil {
					return nil, err
				}
				return m.Run, nil
			})
		},
	}
	fs := cmd.Flags()
	fs.IntVarP(&cfg.Count, "count", "n", 50, "number of simulated devices")
	fs.StringSliceVar(&urls, "connect", nil, "device tier URL, ws://HOST:PORT"+wire.Path+" or wss:// (repeatable: tried in turn)")
	fs.StringVar(&cfg.Tenant, "tenant", DefaultTenant, "tenant of the simulated devices")
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the signing key that mints the device tokens")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated devices' metrics (each device walks its own way) and node ids (the same at each start on one --data-dir and --seed; fleets sharing a data dir need different seeds)")
	fs.IntVar(&cfg.Rate, "connect-rate", 1000, "devices that start connecting per second (0: all at once)")
	fs.StringVar(&cfg.Tools, "tools", "", "YAML file of local tools every device serves, as okso agent --tools (they run real commands on this host)")
	fs.StringVar(&cfg.Source, "source-addr", "", "local IP address the devices dial from, such as 127.0.0.2 (default: the system's choice); one address reaches one tier port from at most ~28,000 ports, so run larger fleets as several, each from its own")
	addClientFlags(fs, &cfg.TLS)
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

// AgentConfig configures [NewAgent]: okso agent's flags.
type AgentConfig struct {
	Connect []string // device tier URLs, tried in turn
	// Token is the device token; without it, one is minted with the data
	// dir's key, of Tenant, for the node id kept in DataDir.
	Token   string
	Tenant  string
	DataDir string
	// TLS: --ca, and the client certificate of --client-cert, for a tier
	// that asks for one. Without Token, the node id is the certificate's.
	TLS clientFiles
	// Name and Labels are announced to a tier that takes them (--name,
	// --label k=v); Name "" is the host name, as a node name.
	Name   string
	Labels []string
	// Replace takes the data dir's node over from another process serving
	// it (--replace), rather than refuse to start.
	Replace bool
	// Tools is the YAML file of the device's own tools (--tools).
	Tools string
}

// Agent is okso agent: the device agent of this host.
type Agent struct{ agent *agentPart }

// NewAgent loads the agent's token and node id; [Agent.Run] runs it.
func NewAgent(log *slog.Logger, cfg AgentConfig) (*Agent, error) {
	if err := checkConnect(cfg.Connect); err != nil {
		return nil, err
	}
	if cfg.Name != "" && !schemas.ValidNodeName(cfg.Name) {
		return nil, fmt.Errorf("--name %q: want ^[a-z0-9][a-z0-9.-]{0,62}$ (lower-case letters, digits, . and -)", cfg.Name)
	}
	labels, err := parseLabels(cfg.Labels)
	if err != nil {
		return nil, err
	}
	set, err := schemas.Load()
	if err != nil {
		return nil, err
	}
	c := &common{log: log, schemas: set}
	if cfg.Token == "" {
		if c.signer, err = auth.LoadOrCreateSigner(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	pair, err := cfg.TLS.loadPair(log)
	if err != nil {
		return nil, err
	}
	nodeID := ""
	if pair != nil {
		if nodeID, err = certNode(pair, cfg.TLS.Cert); err != nil {
			return nil, err
		}
		if sub, err := auth.UnverifiedSubject(cfg.Token); cfg.Token != "" && err == nil && sub != nodeID {
			log.Warn("the client certificate is another node's than the token's: a tier with --client-ca refuses it (4403)",
				"cert_node_id", nodeID, "token_node_id", sub)
		}
	}
	tlsConf, err := cfg.TLS.clientTLS(pair)
	if err != nil {
		return nil, err
	}
	var tools []agent.LocalTool
	if cfg.Tools != "" {
		if tools, err = agent.LoadTools(cfg.Tools); err != nil {
			return nil, err
		}
	}
	a, err := newAgentPart(c, agentSpec{urls: cfg.Connect, tls: tlsConf, token: cfg.Token, dataDir: cfg.DataDir,
		tenant: cfg.Tenant, nodeID: nodeID, name: cfg.Name, labels: labels, replace: cfg.Replace, tools: tools})
	if err != nil {
		return nil, err
	}
	a.endsRole = true
	return &Agent{agent: a}, nil
}

// Run runs the agent until ctx ends: a refused agent says so in the log
// and waits; an agent whose node another process took over says so and
// returns.
func (a *Agent) Run(ctx context.Context) error { return runGroup(ctx, a.agent.actors) }

func agentCmd(stderr io.Writer) *cobra.Command {
	var (
		urls    []string
		token   string
		tenant  string
		dataDir string
		files   clientFiles
		name    string
		labels  []string
		replace bool
		tools   string
		show    bool
		logs    logFlags
	)
	cmd := &cobra.Command{
		Use:     "agent",
		Example: "  # This machine as a node, with its own tools\n  okso agent --connect wss://tier.example.com/v1/device/ws --token \"$DEVICE_TOKEN\" --tools tools.yaml\n  # Check a tools file before deploying it\n  okso agent --tools tools.yaml --describe",
		Short:   "Run the device agent of this machine: echo, and its real metrics",
		Long: "okso agent dials a device tier (several --connect URLs are tried in turn, with\n" +
			"jittered exponential backoff after a loss), authenticates with --token, and serves\n" +
			"system.echo and system.metrics with this host's real figures. Without --token it\n" +
			"mints a device token with the signing key in --data-dir, for a node id it keeps there\n" +
			"(or, with --client-cert, its certificate's node id). One process serves a data dir's\n" +
			"node: a second refuses to start, unless --replace, which takes the node over (the\n" +
			"first stops serving it).\n\n" +
			"--tools FILE adds the device's own tools (YAML: name, description, command, safety,\n" +
			"timeout, ...), each run without a shell with the call's query in TOOL_QUERY; with\n" +
			"--describe it prints them as seed-002 descriptors and exits.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if show {
				return describeTools(cmd.OutOrStdout(), tools)
			}
			return serve(contextOf(cmd), stderr, &logs, func(_ context.Context, log *slog.Logger, _ telemetry) (func(context.Context) error, error) {
				a, err := NewAgent(log, AgentConfig{Connect: urls, Token: token, Tenant: tenant, DataDir: dataDir, TLS: files,
					Name: name, Labels: labels, Replace: replace, Tools: tools})
				if err != nil {
					return nil, err
				}
				return a.Run, nil
			})
		},
	}
	fs := cmd.Flags()
	fs.StringSliceVar(&urls, "connect", nil, "device tier URL, ws://HOST:PORT"+wire.Path+" or wss:// (repeatable: tried in turn)")
	fs.StringVar(&token, "token", "", "device token (its subject is the node id)")
	fs.StringVar(&tenant, "tenant", DefaultTenant, "tenant of the minted token, without --token")
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "signing key and node id, without --token")
	fs.StringVar(&name, "name", "", "name of this node, ^[a-z0-9][a-z0-9.-]{0,62}$ (default: the host name, lower-cased, other characters made -)")
	fs.StringArrayVar(&labels, "label", nil, "label of this node, key=value (repeatable, at most 16); the operator's labels (token, tier) win")
	fs.BoolVar(&replace, "replace", false, "take the data dir's node over from another process serving it (okso agent, all-in-one), which stops serving it")
	fs.StringVar(&tools, "tools", "", "YAML file of this device's own tools, announced as local.<node>.<name>.run")
	fs.BoolVar(&show, "describe", false, "print the --tools file's tools as seed-002 descriptors (JSON) and exit")
	addClientFlags(fs, &files)
	logs.add(fs)
	return cmd
}

const (
	// agentTokenTTL is how long an agent token minted without --ttl is
	// valid: long enough to be pasted into an agent host's configuration
	// and keep working there.
	agentTokenTTL = 30 * 24 * time.Hour
	// deviceTokenTTL is how long a device token minted without --ttl is
	// valid.
	deviceTokenTTL = time.Hour
)

// describeTools prints a tools file's tools as seed-002 descriptors.
func describeTools(w io.Writer, file string) error {
	if file == "" {
		return errors.New("--describe describes the --tools file: give one")
	}
	tools, err := agent.LoadTools(file)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(agent.Describe(tools), "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// tokenCmd prints tokens on stdout, bare, for scripts to capture; what
// a person needs to know about one (its validity) goes to stderr.
func tokenCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage okso tokens"}
	var (
		o       auth.MintOptions
		dataDir string
		isDev   bool
		nodeID  string
		labels  []string
		// noNodeTools mints the claim node_tools: false.
		noNodeTools bool
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
			if !schemas.ValidTenant(o.Tenant) {
				return fmt.Errorf("--tenant %q: use 1-64 letters, digits, _ or -", o.Tenant)
			}
			if o.TTL <= 0 {
				return fmt.Errorf("--ttl %v: a token needs a validity above zero", o.TTL)
			}
			if isDev {
				if !schemas.ValidNodeID(nodeID) {
					return fmt.Errorf("--node-id %q: want a lower-case ULID (26 characters)", nodeID)
				}
				o.Subject = nodeID
				o.Scopes = []string{auth.ScopeDeviceConnect}
				if o.Labels, err = parseLabels(labels); err != nil {
					return err
				}
				if !cmd.Flags().Changed("ttl") {
					o.TTL = deviceTokenTTL
				}
				if o.Audience == "" {
					o.Audience = auth.AudienceDevice
				}
			} else {
				if len(labels) > 0 {
					return errors.New("--label is a device token's: use --device --node-id")
				}
				if !cmd.Flags().Changed("scope") {
					o.Scopes = []string{auth.ScopeReadOnly}
				}
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
			if o.ToolNames != "" && (isDev || !auth.ValidToolNames(o.ToolNames)) {
				return fmt.Errorf("--tool-names %q: want %s or %s, for an agent token", o.ToolNames, auth.ToolNamesSafe, auth.ToolNamesSeed)
			}
			if noNodeTools {
				if isDev {
					return errors.New("--no-node-tools is an agent token's: drop --device")
				}
				o.NodeTools = new(bool) // false: the claim node_tools: false
			}
			tok, err := signer.Mint(o)
			if err != nil {
				return err
			}
			c, err := auth.UnverifiedClaims(tok)
			if err != nil {
				return fmt.Errorf("read the minted token: %w", err)
			}
			fmt.Fprintln(stdout, tok)
			kind := "agent"
			if isDev {
				kind = "device"
			}
			fmt.Fprintf(stderr, "%s token valid for %s, until %s (--ttl to change)\n",
				kind, validity(o.TTL), c.ExpiresAt.UTC().Format(time.RFC3339))
			return nil
		},
	}
	fs := mint.Flags()
	fs.StringVar(&o.Tenant, "tenant", DefaultTenant, "tenant of the token")
	fs.StringSliceVar(&o.Scopes, "scope", nil, "scopes (repeatable, or space separated); default tools:call:read_only")
	fs.DurationVar(&o.TTL, "ttl", agentTokenTTL, "validity of the token: 720h (30 days) for an agent token, 1h with --device")
	fs.StringVar(&o.Subject, "subject", "agent", "subject (sub) of an agent token")
	fs.StringVar(&o.Audience, "audience", "", "audience (default okso-mcp, or okso-device with --device)")
	fs.BoolVar(&isDev, "device", false, "mint a device token (scope device:connect)")
	fs.StringVar(&o.ToolNames, "tool-names", "", "how the gateway lists tools to this agent: safe (sysecho-<node>-echo-invoke) or seed (sysecho.<node>.echo.invoke); default: the gateway's --tool-names")
	fs.BoolVar(&noNodeTools, "no-node-tools", false, "the gateway leaves the per-node device tools out of this agent's tools/list (they stay callable by name, "+
		"and fleet-nodes, okso-find_tools still find them); default: the gateway's --node-tools")
	fs.StringVar(&nodeID, "node-id", "", "node id of a device token")
	fs.StringArrayVar(&labels, "label", nil, "label of a device token's node, key=value (repeatable, at most 16): it wins over the device's own")
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
		sec     natsSecurity
		dataDir string
	)
	cmd := &cobra.Command{
		Use:   "revoke [JTI]",
		Short: "Revoke a token, by its id (jti) or whole (--token): every gateway and tier refuses it",
		Long: "okso token revoke writes the token id to the shared revocation bucket (KV okso_revoked)\n" +
			"on the NATS of your gateways and tiers (--nats-url). Within a second they refuse the token,\n" +
			"and a device whose token it is loses its session (close 4401). The revocation lasts until\n" +
			"the token would have expired (--token), or --until. It connects with the admin's NATS\n" +
			"credential: --nats-nkey or --nats-creds, or else the admin seed in --data-dir.",
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
			ctx, nc, because, done, err := adminSession(contextOf(cmd), natsConfig{URL: natsURL, DataDir: dataDir, natsSecurity: sec},
				"okso-token-revoke", "revoke")
			if err != nil {
				return err
			}
			defer done()
			revs, err := bus.OpenRevocations(ctx, nc, bus.RevocationOptions{Replicas: 1})
			if err != nil {
				return because(err)
			}
			if err := revs.Revoke(ctx, jti, expires); err != nil {
				return because(err)
			}
			fmt.Fprintf(stdout, "revoked %s until %s\n", jti, expires.UTC().Format(time.RFC3339))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&natsURL, "nats-url", "", "NATS of the gateways and tiers (an okso process started with --nats-listen, or your cluster)")
	fs.StringVar(&token, "token", "", "the token to revoke (its jti and expiry are read from it)")
	fs.DurationVar(&until, "until", 30*24*time.Hour, "how long the revocation lasts when the token's expiry is not known")
	addNATSClientFlags(fs, &sec)
	fs.StringVar(&dataDir, "data-dir", defaultDataDir(), "data dir whose admin NATS credential (nats/creds/admin.nk) is used without --nats-nkey or --nats-creds")
	return cmd
}

// adminFlags are the flags of an operator's command that works with the
// admin's NATS credential (okso oauth, okso kinds): the NATS, and the
// credential (--nats-nkey, --nats-creds, or the data dir's).
type adminFlags struct {
	natsURL string
	sec     natsSecurity
	dataDir string
	// of says whose NATS --nats-url names, in its help and its error.
	of string
}

// add adds the flags to c.
func (a *adminFlags) add(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&a.natsURL, "nats-url", "", "NATS of the "+a.of+" (an okso process started with --nats-listen, or your cluster)")
	addNATSClientFlags(fs, &a.sec)
	fs.StringVar(&a.dataDir, "data-dir", defaultDataDir(), "data dir whose admin NATS credential (nats/creds/admin.nk) is used without --nats-nkey or --nats-creds")
}

// session is adminSession on the flags' NATS.
func (a *adminFlags) session(cmd *cobra.Command, name, what string) (context.Context, *nats.Conn, func(error) error, func(), error) {
	if a.natsURL == "" {
		return nil, nil, nil, nil, errors.New("--nats-url is required: the NATS of the " + a.of)
	}
	return adminSession(contextOf(cmd), natsConfig{URL: a.natsURL, DataDir: a.dataDir, natsSecurity: a.sec}, name, what)
}

// adminSession connects as the admin for one short task (10 s): ctx ends
// at once, rather than at the deadline, when NATS refuses a write for
// want of the admin's permission (it says so asynchronously), and
// because turns the task's error into that refusal, saying what only the
// admin may do. done closes the connection.
func adminSession(parent context.Context, cfg natsConfig, name, what string) (
	ctx context.Context, nc *nats.Conn, because func(error) error, done func(), err error) {
	_, nc, err = adminConn(parent, cfg, name)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(parent, 10*time.Second)
	ctx, denied := context.WithCancelCause(ctx)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			denied(fmt.Errorf("%w: only the admin's NATS credential may %s (okso nats creds --role admin)", err, what))
		}
	})
	because = func(err error) error {
		if cause := context.Cause(ctx); err != nil && cause != nil &&
			!errors.Is(cause, context.DeadlineExceeded) && !errors.Is(cause, context.Canceled) {
			return cause
		}
		return err
	}
	return ctx, nc, because, func() { denied(nil); cancel(); nc.Close() }, nil
}

// validity says how long a token is valid, in days when it is whole days.
func validity(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d == day:
		return "1 day"
	case d > day && d%day == 0:
		return fmt.Sprintf("%d days", d/day)
	}
	return d.String()
}
