package roles

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/oklog/run"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/internal/logwriter"
	"github.com/okso-io/okso/internal/procs"
	"github.com/okso-io/okso/internal/repeats"
	"github.com/okso-io/okso/internal/terminal"
)

// logFlags are the flags of a server role's process, the same in every
// server role: its log, the debug listener, and GOMAXPROCS.
type logFlags struct {
	level   string
	format  string
	audit   bool
	repeats time.Duration
	debug   string
	metrics string
	otlp    string
	procs   bool
	role    string // the command's name: gateway, device, …

	fs *pflag.FlagSet // tells a flag given (or set from OKSO_*) from its default
}

func (l *logFlags) add(fs *pflag.FlagSet) {
	l.fs, l.role = fs, fs.Name()
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "", "log format: json or text (default: text when stderr is a terminal, else json)")
	fs.BoolVar(&l.audit, "log-audit", false, "gateway and device tier: also write each audit event to the log as a line "+
		"\"msg\":\"audit\" (default: on unless stderr is a terminal); events go to NATS (okso.v1.audit.<tenant>) either way")
	fs.DurationVar(&l.repeats, "log-repeats", 10*time.Second, "bound the log under floods: in each period this long, "+
		"the first warning, error or audit line of a kind is written and the others of that kind are counted, "+
		"in one line at the period's end (0: write every line)")
	fs.StringVar(&l.debug, "debug-addr", "", "serve Go's profiles (/debug/pprof/) on host:port (off by default)")
	fs.StringVar(&l.metrics, "metrics-addr", defaultMetricsAddr, "serve Prometheus metrics (/metrics) on host:port (\"\": off); "+
		"the default taken by another role on this host is a warning, an address given that cannot be bound an error")
	fs.StringVar(&l.otlp, "otlp-endpoint", "", "export a span of each call's hop through this role over OTLP/HTTP to this URL "+
		"(an OpenTelemetry Collector's or Jaeger's http://HOST:4318; off by default)")
	fs.BoolVar(&l.procs, "adaptive-procs", true, "adapt GOMAXPROCS to the load: one P while the process uses "+
		"well under a core, Go's default above (off when the GOMAXPROCS variable is set)")
}

// processLog is a server role's log: slog records, their repeats bounded
// (--log-repeats), through a [logwriter.Writer]. The periods of the
// repeats are ended by a goroutine of its own. Close it once the role has
// stopped.
type processLog struct {
	*slog.Logger
	out  *logwriter.Writer
	stop func() // ends the repeats' periods, writing the last one's
}

// open makes the role's log, writing to w. The flags not given suit
// where w goes: a person's terminal gets text and no audit lines,
// anything else JSON with them.
func (l *logFlags) open(w io.Writer) (*processLog, error) {
	l.defaults(terminal.Is(w))
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
	p := &processLog{out: logwriter.New(w), stop: func() {}}
	var h slog.Handler = slog.NewJSONHandler(p.out, o)
	if l.format == "text" {
		h = slog.NewTextHandler(p.out, o)
	}
	h = logwriter.FlushOnError(h, p.out)
	if l.repeats > 0 {
		var counts *repeats.Counts
		h, counts = repeats.New(h, time.Now())
		tick := time.NewTicker(l.repeats)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			counts.Run(ctx, tick.C)
		}()
		p.stop = func() {
			cancel()
			<-done
			tick.Stop()
		}
	}
	p.Logger = slog.New(h)
	return p, nil
}

// Close writes the repeats counted in the last period, then the lines
// still waiting; the log writes through after it.
func (p *processLog) Close() {
	p.stop()
	p.out.Close()
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

// auditLog is how the role's auditors log, once open has settled
// --log-audit.
func (l *logFlags) auditLog() auditLog {
	return auditLog{NoAuditLog: !l.audit, LogRepeats: l.repeats}
}

// listenDebug binds --debug-addr, if set, for net/http/pprof; nil if not.
func (l *logFlags) listenDebug(log *slog.Logger) (*httpPart, error) {
	if l.debug == "" {
		return nil, nil
	}
	p, err := listen("--debug-addr", l.debug, 0)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	p.handle(log, mux)
	log.Info("debug listener", "debug_url", "http://"+p.addr()+"/debug/pprof/")
	return p, nil
}

// adaptProcs adds an actor that adapts GOMAXPROCS to the load
// (--adaptive-procs) until interrupted, then gives Go's default back.
func (l *logFlags) adaptProcs(log *slog.Logger) func(*run.Group) {
	return func(g *run.Group) {
		if !l.procs {
			return
		}
		contextActor(g, func(ctx context.Context) error {
			procs.Adapt(ctx, log)
			<-ctx.Done() // Adapt returns at once when it has nothing to do
			return nil
		})
	}
}
