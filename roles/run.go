package roles

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/oklog/run"
)

// runGroup runs the actors that adds add, in one group with oklog/run's
// semantics: when any actor returns, every other is interrupted, in the
// order they were added, and runGroup returns once all have returned,
// with the first one's error. ctx ending interrupts them too, and is a
// clean stop: runGroup returns nil then.
func runGroup(ctx context.Context, adds ...func(*run.Group)) error {
	var g run.Group
	g.Add(run.ContextHandler(ctx))
	for _, add := range adds {
		add(&g)
	}
	err := g.Run()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// contextActor adds fn to g, run with a context cancelled on interrupt.
func contextActor(g *run.Group, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	g.Add(func() error { return fn(ctx) }, func(error) { cancel() })
}

// serve is what every server role's command does once its flags are
// parsed. It opens the process's log on stderr and binds --debug-addr;
// binds --metrics-addr; then build makes the role with that log and its
// telemetry (binding the role's listeners, so that it fails at once when
// it cannot start) and says, in one line, where it listens. The role's Run then runs in one group with the process's own
// actors, the debug and metrics listeners and adaptive GOMAXPROCS, until
// ctx ends or one of them returns. Every error, of the start or of the
// run, is returned, and main writes it on stderr, after the last log
// line.
func serve(ctx context.Context, stderr io.Writer, logs *logFlags,
	build func(ctx context.Context, log *slog.Logger, tel telemetry) (run func(context.Context) error, err error)) error {
	log, err := logs.open(stderr)
	if err != nil {
		return err
	}
	defer log.Close()
	debug, err := logs.listenDebug(log.Logger)
	if err != nil {
		return err
	}
	reg := newProcessRegistry()
	metrics, err := logs.listenMetrics(log.Logger, reg)
	if err != nil {
		debug.close()
		return err
	}
	tel := telemetry{Metrics: reg}
	if metrics != nil {
		tel.MetricsURL = "http://" + metrics.addr() + "/metrics"
	}
	if tel.Tracer, err = logs.tracer(ctx); err != nil {
		debug.close()
		metrics.close()
		return err
	}
	tracer := tel.Tracer
	defer func() {
		// The spans not yet exported, within a few seconds.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tracer.Shutdown(sctx); err != nil {
			log.Warn("export the last spans", "err", err)
		}
	}()
	runRole, err := build(ctx, log.Logger, tel)
	if err != nil {
		debug.close()
		metrics.close()
		return err
	}
	if !logs.announces() && tel.MetricsURL != "" {
		log.Info("metrics listener", "metrics_url", tel.MetricsURL)
	}
	return runGroup(ctx,
		func(g *run.Group) { contextActor(g, runRole) },
		debug.actors,
		metrics.actors,
		logs.adaptProcs(log.Logger),
	)
}
