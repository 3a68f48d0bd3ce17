package device

import (
	"sync"
	"time"
)

// A writeGuard bounds how long a connection's writes may stall: while
// writes are pending and none has completed for its timeout, it calls
// stall once, which closes the connection and so fails them.
//
// It stands in for a deadline context per write (what the WebSocket
// library takes), whose timer and cancellation plumbing cost eight
// allocations and more time than the write's own work; the guard's one
// timer is reset and stopped without allocating.
type writeGuard struct {
	timeout time.Duration
	mu      sync.Mutex
	pending int
	timer   *time.Timer
}

func newWriteGuard(timeout time.Duration, stall func()) *writeGuard {
	g := &writeGuard{timeout: timeout, timer: time.AfterFunc(time.Hour, stall)}
	g.timer.Stop()
	return g
}

// begin notes a write about to start.
func (g *writeGuard) begin() {
	g.mu.Lock()
	if g.pending == 0 {
		g.timer.Reset(g.timeout)
	}
	g.pending++
	g.mu.Unlock()
}

// end notes a write done. One that succeeded is progress, so the others
// pending get a whole timeout again; one that failed is not.
func (g *writeGuard) end(ok bool) {
	g.mu.Lock()
	g.pending--
	switch {
	case g.pending == 0:
		g.timer.Stop()
	case ok:
		g.timer.Reset(g.timeout)
	}
	g.mu.Unlock()
}
