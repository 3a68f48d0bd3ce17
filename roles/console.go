package roles

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/okso-io/okso/bench"
	"github.com/okso-io/okso/bus"
)

// summaryPeriod is how often a gateway writes its calls line.
const summaryPeriod = time.Minute

// callSummary counts the decisions a gateway audits and, at each tick of
// run, writes one line about those since the last: how many, how many
// allowed, the others by code (by decision when they have none) and the
// p50 and p99 of the allowed ones' durations. A period with none writes
// nothing. The end of a stream is left out: its duration is the stream's
// life. The zero value (with log set) is ready to use; it is safe for
// concurrent use.
type callSummary struct {
	log    *slog.Logger
	period time.Duration // for the line: how long a tick is

	mu     sync.Mutex
	calls  int
	failed map[string]int
	took   *bench.Histogram // of the allowed ones; nil when none
}

// observe counts one audited decision; it is an [bus.Auditor]'s Observe.
func (s *callSummary) observe(e bus.AuditEvent) {
	if e.Decision == bus.DecisionStreamClosed {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if e.Decision == bus.DecisionAllowed {
		if s.took == nil {
			s.took = new(bench.Histogram)
		}
		s.took.Record(e.Duration)
		return
	}
	code := e.Code
	if code == "" {
		code = e.Decision
	}
	if s.failed == nil {
		s.failed = map[string]int{}
	}
	s.failed[code]++
}

// run writes a line at each tick until ctx ends.
func (s *callSummary) run(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			s.flush()
		}
	}
}

// flush writes the line of the calls counted since the last, if any.
func (s *callSummary) flush() {
	s.mu.Lock()
	calls, failed, took := s.calls, s.failed, s.took
	s.calls, s.failed, s.took = 0, nil, nil
	s.mu.Unlock()
	if calls == 0 {
		return
	}
	ok := 0
	if took != nil {
		ok = int(took.Count())
	}
	attrs := []any{"period", s.period.String(), "calls", calls, "ok", ok}
	if len(failed) > 0 {
		var codes []any
		for _, code := range slices.Sorted(maps.Keys(failed)) {
			codes = append(codes, slog.Int(code, failed[code]))
		}
		attrs = append(attrs, slog.Group("failed", codes...))
	}
	if took != nil {
		attrs = append(attrs, "p50", took.Quantile(0.5).Round(time.Microsecond),
			"p99", took.Quantile(0.99).Round(time.Microsecond))
	}
	s.log.Info("calls", attrs...)
}
