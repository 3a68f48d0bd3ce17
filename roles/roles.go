// Package roles is okso's composition root: one cobra command per role
// (all-in-one, gateway, device, remote, mock-fleet, agent, token, nats,
// endpoint, bench, stdio), flags and OKSO_*
// environment variables turned into config, and the parts wired and run
// in one run group. Nothing else in okso reads flags.
package roles

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/mcp"
)

// Version is the okso version, set at build time with -ldflags.
var Version = "dev"

// Defaults, all on loopback.
const (
	DefaultMCPAddr    = "127.0.0.1:8080"
	DefaultDeviceAddr = "127.0.0.1:8081"
	DefaultTenant     = "demo"
)

// NewRoot returns the okso command with every role.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "okso",
		Short: "okso lets AI agents operate a fleet of edge devices through MCP",
		Long: "okso serves every capability of every connected device as an MCP tool.\n" +
			"Start with `okso all-in-one`. Every flag can also be set as OKSO_<FLAG>,\n" +
			"e.g. OKSO_MCP_ADDR for --mcp-addr.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return bindEnv(cmd.Flags())
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate(versionLine() + "\n")
	root.AddCommand(
		versionCmd(stdout),
		allInOneCmd(stdout, stderr),
		gatewayCmd(stderr),
		deviceCmd(stderr),
		remoteCmd(stderr),
		mockFleetCmd(stderr),
		agentCmd(stderr),
		tokenCmd(stdout, stderr),
		natsCmd(stdout),
		oauthCmd(stdout),
		kindsCmd(stdout),
		endpointCmd(stdout),
		benchCmd(stdout, stderr),
		stdioCmd(stderr),
	)
	return root
}

// versionLine is what `okso version` and `okso --version` print: the
// version, and the Go release and commit this binary was built with, when
// the build recorded them.
func versionLine() string {
	line := "okso version " + Version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return line
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(len(s.Value), 12)]
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+changes"
			}
		}
	}
	if rev != "" {
		return fmt.Sprintf("%s (commit %s%s, %s)", line, rev, modified, bi.GoVersion)
	}
	return fmt.Sprintf("%s (%s)", line, bi.GoVersion)
}

func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print okso's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, versionLine())
			return err
		},
	}
}

// bindEnv sets every flag not given on the command line from OKSO_<NAME>.
func bindEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		env := "OKSO_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", env, e)
			}
		}
	})
	return err
}

func defaultDataDir() string {
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".okso")
	}
	return ".okso"
}

// addNATSFlags adds the flags that select embedded or external NATS.
func addNATSFlags(fs *pflag.FlagSet, c *natsConfig) {
	fs.StringVar(&c.URL, "nats-url", "", "connect to this NATS server or cluster (comma separated URLs) instead of embedding one")
	fs.StringVar(&c.Listen, "nats-listen", "", "also expose the embedded NATS server on host:port (port 0: any)")
	fs.StringVar(&c.Name, "nats-name", "", "name of the embedded NATS server, unique in its cluster; its JetStream store is <data-dir>/nats/<name> "+
		"(default: one made on first start and kept in <data-dir>/nats/<role>.name)")
	fs.StringVar(&c.Cluster, "nats-cluster", "", "join the embedded NATS server to this cluster (with --nats-cluster-addr)")
	fs.StringVar(&c.Addr, "nats-cluster-addr", "", "host:port the embedded server takes routes on")
	fs.StringSliceVar(&c.Routes, "nats-routes", nil, "nats-route://host:port of the other cluster members (repeatable)")
	fs.IntVar(&c.Replicas, "registry-replicas", 0, "replicas of okso's JetStream buckets (0: 3 in a cluster of 3 or more, else 1)")
	addNATSSecurityFlags(fs, &c.natsSecurity)
}

// gatewayFlags are the flags of the agents' door.
func addGatewayFlags(fs *pflag.FlagSet, c *gatewayConfig) {
	fs.StringVar(&c.Addr, "mcp-addr", DefaultMCPAddr, "gateway HTTP listen address (MCP at /mcp)")
	fs.DurationVar(&c.Budget, "budget", 5*time.Second, "end-to-end deadline of one tool call")
	fs.BoolVar(&c.Stateful, "stateful", false, "serve MCP sessions (single replica only); default stateless")
	fs.BoolVar(&c.NoFastPath, "no-fast-path", false, "answer every tools/call through the MCP SDK's per-request session (SSE) instead of okso's JSON fast path")
	fs.StringVar(&c.ToolNames, "tool-names", auth.ToolNamesSafe, "how tools/list names tools: safe (dots as dashes, sysecho-<node>-echo-invoke, which every agent host accepts) "+
		"or seed (sysecho.<node>.echo.invoke); a token's tool_names claim wins, and a call by either form works")
	fs.VarPF(negated{&c.NoNodeTools}, "node-tools", "", "list the per-node device tools in tools/list; false lists only okso's own (fleet-nodes, okso-find_tools…), "+
		"upstream and caller tools, and a per-node tool stays callable by name; a token's node_tools claim wins").NoOptDefVal = "true"
	fs.StringSliceVar(&c.AllowedOrigins, "allowed-origin", nil, "browser origin trusted to call /mcp (repeatable)")
	fs.StringVar(&c.Audience, "audience", "", "audience agent tokens must carry (default okso-mcp)")
	fs.DurationVar(&c.AuditRetention, "audit-retention", 0, "keep audit events (okso.v1.audit.>) in the JetStream stream okso_audit this long (0: publish only)")
	fs.StringVar(&c.OAuthIssuers, "oauth-issuers", "", "YAML file of the OAuth issuers (identity providers) whose access tokens the gateway accepts beside okso's (see README, Sign in with OAuth); checked and discovered at start")
	fs.StringVar(&c.PublicURL, "public-url", "", "the gateway's URL as clients reach it (e.g. https://okso.example.com), for OAuth metadata")
	fs.IntVar(&c.MaxStreamsPerTenant, "max-streams-per-tenant", 256, "streams a tenant may hold open; one more is closed with 4429")
	fs.IntVar(&c.MaxConnections, "mcp-max-connections", 16384, "connections the MCP listener holds at once (0: no bound); more wait until one closes")
	fs.DurationVar(&c.ShutdownDrain, "shutdown-drain", 0, "on stop, stay unready (/readyz 503) but serving this long, answering with Connection: close, before closing the listener (for load balancers)")
	fs.DurationVar(&c.StreamPing, "stream-ping-interval", 25*time.Second, "heartbeat of metric streams")
	fs.DurationVar(&c.StreamIdle, "stream-idle-timeout", 90*time.Second, "a stream whose client makes no read progress this long is closed with 4408")
	fs.DurationVar(&c.FleetBudget, "fleet-budget", mcp.DefaultFleetBudget, "how long one fleet.call fan-out may take in all; a node that has not answered by then is E_DEADLINE_EXCEEDED in its row")
	fs.DurationVar(&c.CallerTimeout, "caller-timeout", 60*time.Second, "how long a call to an agent's own tool (caller_tools_listen) waits for its answer; then E_DEADLINE_EXCEEDED")
	fs.DurationVar(&c.CallerLeaseTTL, "caller-lease-ttl", 15*time.Second, "lease of a caller's declaration and of its claim of the caller_id in okso_callers: how long they outlive a gateway that died holding its listen (at least 1s)")
}

// negated is a boolean flag that stores the negation of its value, so
// that a config field whose zero value is the default (NoNodeTools) is
// set by a flag that is true by default (--node-tools).
type negated struct{ p *bool }

func (n negated) String() string {
	if n.p == nil { // pflag's zero value of the type
		return "true"
	}
	return strconv.FormatBool(!*n.p)
}

func (n negated) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*n.p = !v
	return nil
}

func (negated) Type() string     { return "bool" }
func (negated) IsBoolFlag() bool { return true }

func addTierFlags(fs *pflag.FlagSet, c *tierConfig) {
	fs.StringVar(&c.Addr, "device-addr", DefaultDeviceAddr, "device tier listen address (WebSocket at /v1/device/ws)")
	fs.IntVar(&c.MaxFrameBytes, "max-frame-bytes", 64<<10, "largest frame a device may send")
	fs.DurationVar(&c.AuthTimeout, "auth-timeout", 5*time.Second, "time a device has to authenticate, and then to announce")
	fs.DurationVar(&c.PingInterval, "ping-interval", tier.DefaultPingInterval, "the tier pings a device it heard nothing from (no frame, ping, pong or heartbeat) for this long; an okso device sends a heartbeat after 30s of its own silence, so only other devices need the tier's pings")
	fs.DurationVar(&c.PingTimeout, "ping-timeout", tier.DefaultPingTimeout, "how long a pinged device has to answer before it is dropped with 4408 (0: --ping-interval)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", 15*time.Second, "the tier's lease in the registry, refreshed every third of it: how long its nodes stay online after it died")
	fs.DurationVar(&c.OfflineRetention, "offline-retention", bus.DefaultOfflineRetention, "how long the registry keeps the record of a node that left: until then a call of its tools answers E_NODE_OFFLINE to its tenant (at least 1s)")
	fs.Float64Var(&c.ConnRatePerIP, "conn-rate-per-ip", 100, "device connection attempts per second from one address (-1: no limit); excess ones close with 4429")
	fs.IntVar(&c.ConnBurstPerIP, "conn-burst-per-ip", 1000, "burst of device connection attempts from one address")
	fs.IntVar(&c.MaxSessions, "max-sessions", 50000, "device connections the tier holds; excess ones close with 4429")
	fs.IntVar(&c.MaxHandshakes, "max-handshakes", tier.DefaultMaxHandshakes, "device handshakes (upgrade to announce_ok) the tier runs at once, bounding its JetStream requests in a connect storm; a device beyond them waits up to 2s, then closes with 4429 (-1: no bound)")
	fs.IntVar(&c.MaxConnections, "device-max-connections", 0, "connections the device listener holds at once (0: --max-sessions + 1024); more wait until one closes")
	fs.IntVar(&c.MaxPendingPerNode, "max-pending-per-node", 64, "calls in flight to one node; excess ones get E_RATE_LIMITED")
	fs.IntVar(&c.MaxToolsPerTenant, "max-tools-per-tenant", tier.DefaultMaxToolsPerTenant, "tools a tenant's devices may register in all, on every tier (-1: no cap); an announce beyond it closes with 4403")
	fs.DurationVar(&c.MaxClockSkew, "max-clock-skew", tier.DefaultMaxClockSkew, "how far the gateways' clocks may be from the tier's: a call whose deadline passed longer ago is refused unsent")
	fs.StringVar(&c.NodeLabels, "node-labels", "", "file of the operator's node names and labels by node id (YAML or JSON; see README, Names and labels): they win over the devices' own; read at start")
	fs.DurationVar(&c.NodeBindingTTL, "node-binding-ttl", bus.DefaultBindingTTL, "how long a node id stays its tenant's after its last session ends (no TTL while one is up); another tenant's device with that id closes with 4403")
}

// contextOf is the command's context, cancelled by a signal in main.
func contextOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
