package roles

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
)

// AllInOneConfig configures [AllInOne].
type AllInOneConfig struct {
	Gateway    gatewayConfig
	Tier       tierConfig
	Remote     remoteConfig // --remotes: the federated upstreams
	NATSListen string
	// NATS secures the embedded server: --nats-insecure, --nats-tls-*.
	NATS    natsSecurity
	DataDir string
	Mock    int
	Seed    uint64
	Tenant  string
	// TLS, if set, is the certificate of both listeners (it overrides
	// Gateway.TLS and Tier.TLS).
	TLS tlsFiles
	// LocalAgent runs a device agent for this host.
	LocalAgent bool
	// Tools are the local agent's own tools (--tools), already loaded.
	Tools []agent.LocalTool
	// ToolsFile is where they come from: NewAllInOne loads it when Tools
	// is empty.
	ToolsFile string
	// Replace takes the data dir's node over from another process
	// serving it (--replace), rather than refuse to start.
	Replace bool
	auditLog
	telemetry
}

// AllInOne is embedded NATS, the gateway, the device tier and simulated
// devices in one process, each part with its own NATS connection: the
// parts of the split roles, composed.
type AllInOne struct {
	c      *common
	nats   *natsPart
	gw     *gatewayPart
	tier   *tierPart
	remote *remotePart // nil: no upstream to federate
	fleet  *fleetPart
	agent  *agentPart
}

// NewAllInOne starts NATS and binds both listeners; [AllInOne.Run] serves.
// It fails, saying why, when it cannot start within startTimeout (12 s).
func NewAllInOne(ctx context.Context, log *slog.Logger, cfg AllInOneConfig) (_ *AllInOne, err error) {
	if cfg.Tier.ClientCA != "" && (cfg.Mock > 0 || cfg.LocalAgent) {
		return nil, errors.New(ownDevicesMTLS + " (--mock 0 --local-agent=false): run them apart, with --client-cert")
	}
	ctx, cancel := startContext(ctx)
	defer cancel()
	c, err := loadCommon(log, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.audit, c.metrics, c.tracer = cfg.auditLog, cfg.Metrics, cfg.Tracer
	if cfg.TLS != (tlsFiles{}) {
		cfg.Gateway.TLS, cfg.Tier.TLS = cfg.TLS, cfg.TLS
	}
	a := &AllInOne{c: c}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if a.nats, err = openNATS(ctx, natsConfig{Listen: cfg.NATSListen, DataDir: cfg.DataDir, Role: "all-in-one", Log: log,
		AuditRetention: cfg.Gateway.AuditRetention, natsSecurity: cfg.NATS}); err != nil {
		return nil, err
	}
	if a.tier, err = newTierPart(ctx, c, a.nats, cfg.Tier); err != nil {
		return nil, err
	}
	if a.gw, err = newGatewayPart(ctx, c, a.nats, cfg.Gateway); err != nil {
		return nil, err
	}
	if a.remote, err = newRemotePart(ctx, c, a.nats, cfg.Remote, "--remotes"); err != nil {
		return nil, err
	}
	if a.fleet, err = newFleetPart(c, fleetAllInOne, cfg.Mock, cfg.Tenant, []string{a.tier.url()}, &fleetOptions{TLS: a.tier.ownTLS()}, cfg.Seed); err != nil {
		return nil, err
	}
	if cfg.ToolsFile != "" && !cfg.LocalAgent {
		return nil, errors.New("--tools are the local agent's: not with --local-agent=false")
	}
	if cfg.ToolsFile != "" && cfg.Tools == nil {
		if cfg.Tools, err = agent.LoadTools(cfg.ToolsFile); err != nil {
			return nil, err
		}
	}
	if cfg.LocalAgent {
		if a.agent, err = newAgentPart(c, agentSpec{urls: []string{a.tier.url()}, tls: a.tier.ownTLS(), dataDir: cfg.DataDir,
			tenant: cfg.Tenant, replace: cfg.Replace, tools: cfg.Tools}); err != nil {
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
	// Interrupted in this order: the gateway drains its calls while the
	// devices and upstreams still answer; then this process's own devices
	// stop, so that the tier's 1001 is no outage to them; then the tiers.
	return runGroup(ctx, a.gw.actors, a.fleet.actors, a.agent.actors, a.tier.actors, a.remote.actors)
}

func (a *AllInOne) close() {
	a.agent.close()
	if a.gw != nil {
		a.gw.close()
	}
	if a.tier != nil {
		a.tier.close()
	}
	a.remote.close()
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
		Use:     "all-in-one",
		Example: "  # Everything on this machine: NATS, gateway, device tier, 3 mock devices and this host's agent\n  okso all-in-one\n  # 50 mock devices, metrics on another port, spans to a local OpenTelemetry Collector\n  okso all-in-one --mock 50 --metrics-addr 127.0.0.1:9465 --otlp-endpoint http://127.0.0.1:4318",
		Short:   "Run NATS, the gateway, the device tier and simulated devices in one process",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(contextOf(cmd), stderr, &logs, func(ctx context.Context, log *slog.Logger, tel telemetry) (func(context.Context) error, error) {
				cfg.auditLog, cfg.telemetry = logs.auditLog(), tel
				a, err := NewAllInOne(ctx, log, cfg)
				if err != nil {
					return nil, err
				}
				if err := a.writeBanner(stdout, cfg, ttl, &logs, tel.MetricsURL); err != nil {
					a.close()
					return nil, err
				}
				return a.Run, nil
			})
		},
	}
	fs := cmd.Flags()
	addGatewayFlags(fs, &cfg.Gateway)
	addOAuthFlags(fs, &cfg.Gateway.OAuth, true)
	addTierFlags(fs, &cfg.Tier)
	addTLSFlags(fs, &cfg.TLS, "both the MCP endpoint (https://) and the device tier (wss://)")
	fs.StringVar(&cfg.Tier.ClientCA, "client-ca", "", clientCAUsage+"; needs --mock 0 --local-agent=false")
	fs.StringVar(&cfg.Remote.Config, "remotes", "", "federate the MCP servers and action endpoints of this config file as tools (YAML; see README, Bring your own MCP servers)")
	addRemoteFlags(fs, &cfg.Remote)
	fs.StringVar(&cfg.NATSListen, "nats-listen", "", "also expose the embedded NATS server on host:port (port 0: any); "+
		"other processes connect with a role's credential (okso nats creds)")
	addNATSServerFlags(fs, &cfg.NATS)
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the signing key (created on first start) and of the NATS store (nats/: revocations)")
	fs.IntVar(&cfg.Mock, "mock", 3, "number of simulated devices")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the simulated devices' metrics and node ids (the same at each start on one --data-dir and --seed; fleets sharing a data dir need different seeds)")
	fs.BoolVar(&cfg.LocalAgent, "local-agent", true, "run a device agent for this host (its real metrics)")
	fs.StringVar(&cfg.ToolsFile, "tools", "", "YAML file of the local agent's own tools (see okso agent --tools)")
	fs.BoolVar(&cfg.Replace, "replace", false, "take this host's node over from another process serving it on --data-dir (okso agent), which stops serving it")
	fs.StringVar(&cfg.Tenant, "tenant", DefaultTenant, "tenant of the simulated devices and of the printed token")
	fs.DurationVar(&ttl, "token-ttl", agentTokenTTL, "validity of the printed agent token (as long as okso token mint's by default)")
	logs.add(fs)
	return cmd
}

// writeBanner prints where each part is and how to start, with a
// read-only agent token valid for ttl.
func (a *AllInOne) writeBanner(w io.Writer, cfg AllInOneConfig, ttl time.Duration, logs *logFlags, metricsURL string) error {
	token, err := a.Signer().Mint(auth.MintOptions{
		Subject: "agent", Tenant: cfg.Tenant, Scopes: []string{auth.ScopeReadOnly}, TTL: ttl,
	})
	if err != nil {
		return err
	}
	c, err := auth.UnverifiedClaims(token)
	if err != nil {
		return fmt.Errorf("read the minted token: %w", err)
	}
	b := banner{self: selfCommand(os.Args[0]), mcpURL: a.MCPURL(), deviceURL: a.DeviceURL(),
		natsURL: a.NATSURL(), natsSecured: a.nats.secured, dataDir: cfg.DataDir, mock: cfg.Mock, tenant: cfg.Tenant,
		token: token, ttl: ttl, expires: c.ExpiresAt.UTC(), logFormat: logs.format, auditLog: logs.audit,
		oauth: cfg.Gateway.OAuth.Server, metricsURL: metricsURL}
	if abs, err := filepath.Abs(b.dataDir); err == nil {
		b.dataDir = abs
	}
	if a.agent != nil {
		b.hostNode = a.agent.d.NodeID()
	}
	if err := b.write(w); err != nil {
		return fmt.Errorf("write the banner: %w", err)
	}
	return nil
}

// The MCP Inspector release the banner and the README name, and the
// Node.js its package.json engines ask for: npm only warns about an older
// one, and its CLI runs on Node 20 (TestInspectorCLI runs it on the
// machine's Node).
const (
	inspectorVersion = "2.12.0"
	inspectorNode    = "22.19"
)

// banner is what all-in-one prints on stdout once it is ready: where each
// part is and how to start. Scripts read the values of its labels MCP
// endpoint, device tier, NATS and agent token: keep them.
type banner struct {
	self      string // how to run this okso again: "okso", "./bin/okso", "go run ."
	mcpURL    string
	deviceURL string
	natsURL   string // "" unless --nats-listen
	// metricsURL is where /metrics is served ("": not).
	metricsURL string
	// natsSecured: the NATS admits okso's roles alone (not --nats-insecure).
	natsSecured bool
	dataDir     string
	mock        int
	tenant      string
	hostNode    string // "" without the local agent
	token       string
	ttl         time.Duration
	expires     time.Time // the token's exp
	logFormat   string
	auditLog    bool
	oauth       bool // --oauth-server
}

func (b banner) write(w io.Writer) error {
	var buf bytes.Buffer
	row := func(label, format string, args ...any) {
		fmt.Fprintf(&buf, "  %-12s : %s\n", label, fmt.Sprintf(format, args...))
	}
	more := func(format string, args ...any) { // a row's second line
		fmt.Fprintf(&buf, "%17s%s\n", "", fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(&buf, "okso %s all-in-one\n", Version)
	row("MCP endpoint", "%s", b.mcpURL)
	row("dashboard", "%s", strings.TrimSuffix(b.mcpURL, "/mcp")+"/ui/")
	row("device tier", "%s", b.deviceURL)
	if b.metricsURL != "" {
		row("metrics", "%s", b.metricsURL)
	}
	if b.natsURL != "" {
		row("NATS", "%s", b.natsURL)
		if b.natsSecured {
			more("(another process connects as one of okso's roles: %s nats creds --data-dir %s --role gateway|device|remote|audit|admin prints its credential, for --nats-nkey)",
				b.self, shellQuote(b.dataDir))
		}
	}
	row("data dir", "%s", b.dataDir)
	more("(the signing key, and revocations in nats/; give the other roles and token mint the same --data-dir)")
	row("mock devices", "%d (tenant %s)", b.mock, b.tenant)
	if b.hostNode != "" {
		row("this host", "node %s (okso agent)", b.hostNode)
	}
	row("agent token", "%s", b.token)
	more("(tenant %s, scope %s, valid %s, until %s: lists and calls read-only tools)",
		b.tenant, auth.ScopeReadOnly, validity(b.ttl), b.expires.Format(time.RFC3339))
	row("token mint", "%s token mint --data-dir %s --tenant %s --scope %s",
		b.self, shellQuote(b.dataDir), shellQuote(b.tenant), auth.ScopeMutating)
	more("(prints a token that may also call mutating tools, such as gpio-<node>-pin-write)")
	row("try it", "npx -y @modelcontextprotocol/inspector@%s --cli %s --transport http "+
		"--header \"Authorization: Bearer %s\" --method tools/list", inspectorVersion, b.mcpURL, b.token)
	more("(MCP Inspector %s asks for Node.js >= %s; on Node 20 npx warns EBADENGINE and it works all the same)", inspectorVersion, inspectorNode)
	if b.oauth {
		if b.natsURL != "" {
			row("sign in", "%s oauth approve CODE --tenant %s --scope %s --nats-url %s --data-dir %s",
				b.self, shellQuote(b.tenant), auth.ScopeReadOnly, b.natsURL, shellQuote(b.dataDir))
		} else {
			row("sign in", "%s oauth approve CODE --tenant %s --scope %s --nats-url URL (start with --nats-listen 127.0.0.1:4222 for a URL)",
				b.self, shellQuote(b.tenant), auth.ScopeReadOnly)
		}
		more("(an MCP host given %s signs in with OAuth: its page shows CODE; see README, Sign in with OAuth)", b.mcpURL)
	}
	if b.auditLog {
		row("logs", "stderr, %s, with a line per audit event", b.logFormat)
	} else {
		row("logs", "stderr, %s; audit events go to NATS only (--log-audit logs them too)", b.logFormat)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// selfCommand is how a person runs this okso again, given how it was
// started (os.Args[0]): "go run ." when `go run` built it (its binary is
// gone once it exits), else the name or path it was started by.
func selfCommand(arg0 string) string {
	dir := filepath.Dir(arg0)
	if filepath.Base(dir) == "exe" && strings.Contains(dir, "go-build") {
		return "go run ."
	}
	if arg0 == "" {
		return "okso"
	}
	return shellQuote(arg0)
}

// shellSafe matches the words a POSIX shell takes as they are.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,~-]+$`)

// shellQuote returns s as one word for a POSIX shell.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
