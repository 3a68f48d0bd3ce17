// Package procs adapts GOMAXPROCS to the load of a process: one P while
// the process uses well under a core, Go's default as soon as it uses
// most of what it has. Start it with [Adapt], on a goroutine the caller
// owns, and cancel its context to stop it.
package procs

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"time"
)

// An okso call is handed between a dozen goroutines in one process: the
// HTTP handler, nats.go's flusher and reader, nats-server's reader and
// writer (over in-process pipes), the tier's dispatcher and worker, the
// device socket's reader. When another P is idle, each handoff wakes an OS
// thread that spins, finds nothing to steal and sleeps again
// (golang/go#18237). At one call in flight that churn is most of a call's
// cost: on a 2-core machine all-in-one spends about 90 µs of a 0.58 ms call
// on it, and burns CPU the other processes of the chain want. With one P
// the same handoffs run back to back on one thread.
//
// So a server role adapts GOMAXPROCS to its load: one P while the process
// uses well under a core, Go's default (runtime.SetDefaultGOMAXPROCS,
// which follows cgroup limits) as soon as it uses most of what it has.
// Going up takes two busy windows (0.2 s; one alone may be a GC cycle);
// going down waits for a quieter second, so a burst is never held to one
// P for long.
const (
	procsWindow  = 100 * time.Millisecond
	procsUpAfter = 2   // busy windows in a row before going up
	procsDownLag = 10  // windows between two steps down
	procsUpAt    = 0.7 // a window is busy when its load reaches this share of the Ps
	procsPerCore = 0.7 // down to ceil(mean load / this) Ps
)

// procTuner decides GOMAXPROCS from the load, in cores used per window.
// Its zero value is not usable; see newProcTuner.
type procTuner struct {
	cur, max int
	busy     int     // busy windows in a row
	sum      float64 // load since the last step down
	windows  int     // windows since the last step down
}

func newProcTuner(cur, max int) *procTuner { return &procTuner{cur: cur, max: max} }

// next takes the load of the window just ended and returns the
// GOMAXPROCS for the next one.
func (t *procTuner) next(load float64) int {
	if t.cur < t.max && load >= procsUpAt*float64(t.cur) {
		if t.busy++; t.busy >= procsUpAfter {
			t.cur, t.busy, t.sum, t.windows = t.max, 0, 0, 0
			return t.cur
		}
	} else {
		t.busy = 0
	}
	t.sum += load
	if t.windows++; t.windows < procsDownLag {
		return t.cur
	}
	mean := t.sum / float64(t.windows)
	want := min(t.max, max(1, int(math.Ceil(mean/procsPerCore))))
	if want < t.cur {
		t.cur, t.busy = want, 0
	}
	t.sum, t.windows = 0, 0
	return t.cur
}

// Adapt adapts GOMAXPROCS every 100 ms (procsWindow) until ctx ends,
// then gives Go's default back. It returns at once, leaving GOMAXPROCS
// alone, where it has nothing to do: when the GOMAXPROCS environment
// variable is set, where the process's CPU time cannot be read, or on a
// single CPU. Run it on one goroutine at a time.
func Adapt(ctx context.Context, log *slog.Logger) {
	cpu := processCPU()
	if os.Getenv("GOMAXPROCS") != "" || cpu == nil {
		return
	}
	tick := time.NewTicker(procsWindow)
	defer tick.Stop()
	tuneProcs(ctx, log, tick.C, cpu, setProcs, getProcs)
}

// tuneProcs adapts GOMAXPROCS every tick until ctx ends. cpu reports the
// process's CPU time so far; set applies a GOMAXPROCS (0: Go's default)
// and returns the value in force; get returns it. Each tick carries its
// time.
func tuneProcs(ctx context.Context, log *slog.Logger, tick <-chan time.Time, cpu func() time.Duration, set func(int) int, get func() int) {
	max := set(0)
	if max <= 1 {
		return
	}
	t := newProcTuner(max, max)
	var (
		lastCPU  = cpu()
		lastTime time.Time
	)
	for {
		select {
		case <-ctx.Done():
			set(0)
			return
		case now := <-tick:
			if t.cur == t.max {
				// Go's default, which follows the cgroup's limit as it
				// changes (a pod resized in place, say).
				t.max = get()
				t.cur = t.max
			}
			used := cpu()
			if !lastTime.IsZero() && now.After(lastTime) {
				load := float64(used-lastCPU) / float64(now.Sub(lastTime))
				was := t.cur
				if n := t.next(load); n != was {
					if n == t.max {
						// Go's default again, whatever the cgroup allows now.
						t.max = set(0)
						t.cur = t.max
					} else {
						t.cur = set(n)
					}
					log.Debug("GOMAXPROCS adapted to the load", "gomaxprocs", t.cur, "was", was,
						"load_cores", math.Round(load*100)/100)
				}
			}
			lastCPU, lastTime = used, now
		}
	}
}

// setProcs sets GOMAXPROCS (0: Go's default) and returns the value in force.
func setProcs(n int) int {
	if n <= 0 {
		runtime.SetDefaultGOMAXPROCS()
		return runtime.GOMAXPROCS(0)
	}
	runtime.GOMAXPROCS(n)
	return n
}

// getProcs returns the GOMAXPROCS in force.
func getProcs() int { return runtime.GOMAXPROCS(0) }
