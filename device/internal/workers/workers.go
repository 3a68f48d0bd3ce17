// Package workers runs functions on goroutines kept warm between calls,
// for the two ends of the device protocol: the device tier's call
// dispatcher and a device's cmd loop. It is internal to device/ because
// it is nobody's contract, only their shared machinery.
//
// Make a [Pool] with [New], hand it work with [Pool.Run], and [Pool.Close]
// it when done: Close returns once every worker has returned.
package workers

import (
	"sync"
	"sync/atomic"
)

// Pool runs functions on workers. A call's work (decoding, schema
// checks, encoding) grows a goroutine's stack, and a fresh goroutine per
// call pays for that growth every time (7% of the device hop's CPU).
// Work goes to an idle worker when one waits, and to a new goroutine
// otherwise, so a worker stuck on a slow device never holds up another
// call; at most max workers wait idle.
//
// Run may be called from any goroutine, but never with or after Close,
// which the pool's owner calls once.
type Pool struct {
	idle chan func() // unbuffered: a send succeeds only if a worker waits
	n    atomic.Int32
	max  int32
	wg   sync.WaitGroup // every worker
}

// New returns a pool that keeps at most max idle workers.
func New(max int) *Pool {
	return &Pool{idle: make(chan func()), max: int32(max)}
}

// Run runs f on a worker.
func (p *Pool) Run(f func()) {
	select {
	case p.idle <- f:
	default:
		p.wg.Add(1)
		go p.loop(f)
	}
}

func (p *Pool) loop(f func()) {
	defer p.wg.Done()
	for f != nil {
		f()
		if p.n.Add(1) > p.max {
			p.n.Add(-1)
			return
		}
		f = <-p.idle // nil once closed
		p.n.Add(-1)
	}
}

// Close lets the idle workers end and waits for every worker to return,
// the busy ones after their work.
func (p *Pool) Close() {
	close(p.idle)
	p.wg.Wait()
}
