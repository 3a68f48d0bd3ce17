package procs

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

func TestProcTuner(t *testing.T) {
	steps := func(tu *procTuner, loads ...float64) []int {
		var got []int
		for _, l := range loads {
			got = append(got, tu.next(l))
		}
		return got
	}
	repeat := func(l float64, n int) []float64 {
		s := make([]float64, n)
		for i := range s {
			s[i] = l
		}
		return s
	}
	same := func(a, b []int) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	}

	t.Run("a quiet second goes down to one P", func(t *testing.T) {
		got := steps(newProcTuner(4, 4), repeat(0.3, procsDownLag)...)
		for i, p := range got {
			if want := map[bool]int{true: 1, false: 4}[i == procsDownLag-1]; p != want {
				t.Fatalf("procs %v: want 4 for %d windows, then 1", got, procsDownLag-1)
			}
		}
	})
	t.Run("down to what the mean load needs", func(t *testing.T) {
		tu := newProcTuner(8, 8)
		steps(tu, repeat(2.0, procsDownLag)...) // ceil(2.0/0.7) = 3
		if tu.cur != 3 {
			t.Fatalf("procs %d after a mean load of 2 cores, want 3", tu.cur)
		}
	})
	t.Run("two busy windows in a row go up to the maximum", func(t *testing.T) {
		tu := newProcTuner(1, 4)
		if got := steps(tu, 0.9, 0.5, 0.9, 0.85); !same(got, []int{1, 1, 1, 4}) {
			t.Fatalf("procs %v, want [1 1 1 4]", got)
		}
	})
	t.Run("a load that one P carries stays on one P", func(t *testing.T) {
		tu := newProcTuner(1, 2)
		for i, p := range steps(tu, repeat(0.6, 5*procsDownLag)...) {
			if p != 1 {
				t.Fatalf("window %d: procs %d at a load of 0.6 core, want 1", i, p)
			}
		}
	})
	t.Run("after going up it waits a whole lag before going down", func(t *testing.T) {
		tu := newProcTuner(1, 4)
		steps(tu, 0.2, 0.2, 0.2, 0.9, 0.9) // up at the fifth window
		got := steps(tu, repeat(0.1, procsDownLag)...)
		if got[procsDownLag-2] != 4 || got[procsDownLag-1] != 1 {
			t.Fatalf("procs %v: want 4 until the lag ends, then 1", got)
		}
	})
	t.Run("a busy process stays at the maximum", func(t *testing.T) {
		tu := newProcTuner(2, 2)
		for i, p := range steps(tu, repeat(1.5, 3*procsDownLag)...) {
			if p != 2 {
				t.Fatalf("window %d: procs %d, want 2", i, p)
			}
		}
	})
}

// TestTuneProcs drives the loop with scripted ticks and CPU times: it
// steps down after a quiet second, up after two busy windows, and gives
// Go's default back when it stops.
func TestTuneProcs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time)
	cpuNow := make(chan time.Duration, 1)
	cpuNow <- 0
	sets := make(chan int, 16)
	var defaultProcs atomic.Int64 // Go's default, as the cgroup allows
	defaultProcs.Store(4)
	explicit := 0 // the GOMAXPROCS set, 0 when it is Go's default
	set := func(n int) int {
		sets <- n
		explicit = n
		if n == 0 {
			return int(defaultProcs.Load())
		}
		return n
	}
	get := func() int {
		if explicit == 0 {
			return int(defaultProcs.Load()) // the runtime follows the cgroup
		}
		return explicit
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tuneProcs(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), tick, func() time.Duration { return <-cpuNow }, set, get)
	}()
	expect := func(want int) {
		t.Helper()
		select {
		case got := <-sets:
			if got != want {
				t.Fatalf("set(%d), want set(%d)", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no set(%d)", want)
		}
	}
	expect(0) // learns Go's default

	var (
		now  = time.Unix(1000, 0)
		used time.Duration
	)
	// window sends one tick after a window that used load cores.
	window := func(load float64) {
		now = now.Add(procsWindow)
		used += time.Duration(load * float64(procsWindow))
		cpuNow <- used
		tick <- now
	}
	window(0) // the first tick only starts the count
	for range procsDownLag {
		window(0.1)
	}
	expect(1)
	window(0.95)
	window(0.95)
	expect(0) // back to Go's default (4 here)
	// The cgroup now allows 2: Go's default follows, and the tuner with
	// it, so a load that needs 2 Ps changes nothing.
	defaultProcs.Store(2)
	for range procsDownLag + 1 {
		window(1.3)
	}
	window(0.1) // a tick whose set, if any, would land before the check
	select {
	case n := <-sets:
		t.Fatalf("unexpected set(%d)", n)
	default:
	}
	cancel()
	expect(0)
	<-done
}
