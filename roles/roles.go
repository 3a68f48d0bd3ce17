// Package roles is okso's composition root: one cobra command per role
// (all-in-one, gateway, device, mock-fleet, agent, token, bench), flags and OKSO_*
// environment variables turned into config, and the parts wired and run
// in one run group. Nothing else in okso reads flags.
package roles

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
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
		mockFleetCmd(stderr),
		agentCmd(stderr),
		tokenCmd(stdout),
		benchCmd(stdout, stderr),
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

// logFlags are shared by the server roles: logs, the debug listener, and
// GOMAXPROCS.
type logFlags struct {
	level   string
	format  string
	audit   bool
	repeats time.Duration
	debug   string
	procs   bool

	fs  *pflag.FlagSet // tells a flag given (or set from OKSO_*) from its default
	out *logWriter     // under the logger; closed by start's stop
	rep *logRepeats    // of the logger, nil with --log-repeats 0; flushed until start's stop
}

func (l *logFlags) add(fs *pflag.FlagSet) {
	l.fs = fs
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "", "log format: json or text (default: text when stderr is a terminal, else json)")
	fs.BoolVar(&l.audit, "log-audit", false, "gateway and device tier: also write each audit event to the log as a line "+
		"\"msg\":\"audit\" (default: on unless stderr is a terminal); events go to NATS (okso.v1.audit.<tenant>) either way")
	fs.DurationVar(&l.repeats, "log-repeats", 10*time.Second, "bound the log under floods: in each period this long, "+
		"the first warning, error or audit line of a kind is written and the others of that kind are counted, "+
		"in one line at the period's end (0: write every line)")
	fs.StringVar(&l.debug, "debug-addr", "", "serve Go's profiles (/debug/pprof/) on host:port (off by default)")
	fs.BoolVar(&l.procs, "adaptive-procs", true, "adapt GOMAXPROCS to the load: one P while the process uses "+
		"well under a core, Go's default above (off when the GOMAXPROCS variable is set)")
}

// start serves --debug-addr and adapts GOMAXPROCS (--adaptive-procs)
// until stop, which also writes the log lines still waiting.
func (l *logFlags) start(log *slog.Logger) (stop func(), err error) {
	stopRepeats := l.flushRepeats()
	closeLog := func() {
		stopRepeats()
		if l.out != nil {
			l.out.Close()
		}
	}
	stopDebug, err := l.serveDebug(log)
	if err != nil {
		closeLog()
		return nil, err
	}
	cpu := processCPU()
	if !l.procs || os.Getenv("GOMAXPROCS") != "" || cpu == nil {
		return func() { stopDebug(); closeLog() }, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	tick := time.NewTicker(procsWindow)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tuneProcs(ctx, log, tick.C, cpu, setProcs, getProcs)
	}()
	return func() {
		cancel()
		<-done
		tick.Stop()
		stopDebug()
		closeLog()
	}, nil
}

// flushRepeats writes the repeated lines the logger counted at the end of
// each period until stop, and once more then.
func (l *logFlags) flushRepeats() (stop func()) {
	if l.rep == nil {
		return func() {}
	}
	tick := time.NewTicker(l.repeats)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.rep.run(ctx, tick.C)
	}()
	return func() {
		cancel()
		<-done
		tick.Stop()
	}
}

// serveDebug serves net/http/pprof on --debug-addr, if set, until stop.
func (l *logFlags) serveDebug(log *slog.Logger) (stop func(), err error) {
	if l.debug == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", l.debug)
	if err != nil {
		return nil, fmt.Errorf("--debug-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	log.Info("debug listener", "debug_url", "http://"+ln.Addr().String()+"/debug/pprof/")
	return func() { _ = srv.Close(); <-done }, nil
}

// logger makes the role's logger, writing to w through a logWriter that
// start's stop closes. The flags not given suit where w goes: a person's
// terminal gets text and no audit lines, anything else JSON with them.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	l.defaults(isTerminal(w))
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	o := &slog.HandlerOptions{Level: lv}
	if l.format != "json" && l.format != "text" {
		return nil, fmt.Errorf("--log-format %q: want json or text", l.format)
	}
	if l.repeats < 0 {
		return nil, fmt.Errorf("--log-repeats %v: want 0 (off) or more", l.repeats)
	}
	l.out = newLogWriter(w)
	var h slog.Handler = slog.NewJSONHandler(l.out, o)
	if l.format == "text" {
		h = slog.NewTextHandler(l.out, o)
	}
	h = flushOnError{h, l.out}
	if l.repeats > 0 {
		h, l.rep = newRepeatHandler(h, time.Now())
	}
	return slog.New(h), nil
}

// defaults sets --log-format and --log-audit, unless given, for a log
// that goes to a terminal or not.
func (l *logFlags) defaults(terminal bool) {
	given := func(name string) bool { return l.fs == nil || l.fs.Changed(name) }
	if !given("log-format") {
		l.format = "json"
		if terminal {
			l.format = "text"
		}
	}
	if !given("log-audit") {
		l.audit = !terminal
	}
}

// natsFlags select embedded or external NATS.
type natsFlags struct{ c natsConfig }

func (n *natsFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&n.c.URL, "nats-url", "", "connect to this NATS server or cluster (comma separated URLs) instead of embedding one")
	fs.StringVar(&n.c.Listen, "nats-listen", "", "also expose the embedded NATS server on host:port (port 0: any)")
	fs.StringVar(&n.c.Name, "nats-name", "", "name of the embedded NATS server, unique in its cluster; its JetStream store is <data-dir>/nats/<name> "+
		"(default: one made on first start and kept in <data-dir>/nats/<role>.name)")
	fs.StringVar(&n.c.Cluster, "nats-cluster", "", "join the embedded NATS server to this cluster (with --nats-cluster-addr)")
	fs.StringVar(&n.c.Addr, "nats-cluster-addr", "", "host:port the embedded server takes routes on")
	fs.StringSliceVar(&n.c.Routes, "nats-routes", nil, "nats-route://host:port of the other cluster members (repeatable)")
	fs.IntVar(&n.c.Replicas, "registry-replicas", 0, "replicas of okso's JetStream buckets (0: 3 in a cluster of 3 or more, else 1)")
}

// config is the NATS of role, whose embedded server keeps its store in
// dataDir.
func (n *natsFlags) config(dataDir, role string) natsConfig {
	c := n.c
	c.DataDir, c.Role = dataDir, role
	return c
}

// gatewayFlags are the flags of the agents' door.
func addGatewayFlags(fs *pflag.FlagSet, c *gatewayConfig) {
	fs.StringVar(&c.Addr, "mcp-addr", DefaultMCPAddr, "gateway HTTP listen address (MCP at /mcp)")
	fs.DurationVar(&c.Budget, "budget", 5*time.Second, "end-to-end deadline of one tool call")
	fs.BoolVar(&c.Stateful, "stateful", false, "serve MCP sessions (single replica only); default stateless")
	fs.BoolVar(&c.NoFastPath, "no-fast-path", false, "answer every tools/call through the MCP SDK's per-request session (SSE) instead of okso's JSON fast path")
	fs.StringSliceVar(&c.AllowedOrigins, "allowed-origin", nil, "browser origin trusted to call /mcp (repeatable)")
	fs.StringVar(&c.Audience, "audience", "", "audience agent tokens must carry (default okso-mcp)")
	fs.DurationVar(&c.AuditRetention, "audit-retention", 0, "keep audit events (okso.v1.audit.>) in the JetStream stream okso_audit this long (0: publish only)")
	fs.StringVar(&c.PublicURL, "public-url", "", "the gateway's URL as clients reach it (e.g. https://okso.example.com), for OAuth metadata")
	fs.IntVar(&c.MaxStreamsPerTenant, "max-streams-per-tenant", 256, "streams a tenant may hold open; one more is closed with 4429")
	fs.IntVar(&c.MaxConnections, "mcp-max-connections", 16384, "connections the MCP listener holds at once (0: no bound); more wait until one closes")
	fs.DurationVar(&c.ShutdownDrain, "shutdown-drain", 0, "on stop, stay unready (/readyz 503) but serving this long, answering with Connection: close, before closing the listener (for load balancers)")
	fs.DurationVar(&c.StreamPing, "stream-ping-interval", 25*time.Second, "heartbeat of metric streams")
	fs.DurationVar(&c.StreamIdle, "stream-idle-timeout", 90*time.Second, "a stream whose client makes no read progress this long is closed with 4408")
}

func addTierFlags(fs *pflag.FlagSet, c *tierConfig) {
	fs.StringVar(&c.Addr, "device-addr", DefaultDeviceAddr, "device tier listen address (WebSocket at /v1/device/ws)")
	fs.IntVar(&c.MaxFrameBytes, "max-frame-bytes", 64<<10, "largest frame a device may send")
	fs.DurationVar(&c.AuthTimeout, "auth-timeout", 5*time.Second, "time a device has to authenticate, and then to announce")
	fs.DurationVar(&c.PingInterval, "ping-interval", 15*time.Second, "how often the tier pings each device")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", 15*time.Second, "how long a node outlives its tier in the registry")
	fs.Float64Var(&c.ConnRatePerIP, "conn-rate-per-ip", 100, "device connection attempts per second from one address (-1: no limit); excess ones close with 4429")
	fs.IntVar(&c.ConnBurstPerIP, "conn-burst-per-ip", 1000, "burst of device connection attempts from one address")
	fs.IntVar(&c.MaxSessions, "max-sessions", 50000, "device connections the tier holds; excess ones close with 4429")
	fs.IntVar(&c.MaxConnections, "device-max-connections", 0, "connections the device listener holds at once (0: --max-sessions + 1024); more wait until one closes")
	fs.IntVar(&c.MaxPendingPerNode, "max-pending-per-node", 64, "calls in flight to one node; excess ones get E_RATE_LIMITED")
	fs.IntVar(&c.MaxToolsPerTenant, "max-tools-per-tenant", tier.DefaultMaxToolsPerTenant, "tools a tenant's devices may register in all, on every tier (-1: no cap); an announce beyond it closes with 4403")
	fs.DurationVar(&c.MaxClockSkew, "max-clock-skew", tier.DefaultMaxClockSkew, "how far the gateways' clocks may be from the tier's: a call whose deadline passed longer ago is refused unsent")
	fs.DurationVar(&c.NodeBindingTTL, "node-binding-ttl", bus.DefaultBindingTTL, "how long a node id stays its tenant's after its last session (refreshed hourly while one is up); another tenant's device with that id closes with 4403")
}

// runUntil runs fn until ctx is cancelled (by a signal, in main).
func contextOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
