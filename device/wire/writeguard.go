package wire

import (
	"sync"
	"time"
)

// A WriteGuard bounds how long a connection's writes may stall: while
// writes are pending and none has completed for its timeout, it calls
// stall once, which closes the connection and so fails them. Each end of
// the protocol puts one on its connection: a peer that stops reading
// must not hold a writer forever.
//
// It stands in for a deadline context per write (what the WebSocket
// library takes), whose timer and cancellation plumbing cost eight
// allocations and more time than the write's own work; the guard's one
// timer is reset and stopped without allocating. It is safe for
// concurrent use; make one with [NewWriteGuard].
type WriteGuard struct {
	timeout time.Duration
	stall   func()
	mu      sync.Mutex
	pending int
	timer   *time.Timer // nil until the first write
}

// NewWriteGuard returns a guard that calls stall, on a goroutine of its
// own, once writes have been pending for timeout without one completing.
// stall must not block: it should drop the connection (CloseNow).
func NewWriteGuard(timeout time.Duration, stall func()) *WriteGuard {
	return &WriteGuard{timeout: timeout, stall: stall}
}

// Begin notes a write about to start.
func (g *WriteGuard) Begin() {
	g.mu.Lock()
	switch {
	case g.timer == nil:
		// Made by the first write, not with the guard: a device tier
		// holds a guard per connection, mostly idle.
		g.timer = time.AfterFunc(g.timeout, g.stall)
	case g.pending == 0:
		g.timer.Reset(g.timeout)
	}
	g.pending++
	g.mu.Unlock()
}

// End notes a write done. One that succeeded is progress, so the others
// pending get a whole timeout again; one that failed is not.
func (g *WriteGuard) End(ok bool) {
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
