package device

import "sync/atomic"

// workers runs functions on goroutines kept warm between calls. A call's
// work (decoding, schema checks, encoding) grows a goroutine's stack, and
// a fresh goroutine per call pays for that growth every time (7% of the
// device hop's CPU). Work goes to an idle worker when one waits, and to a
// new goroutine otherwise, so a worker stuck on a slow device never holds
// up another call; at most max workers wait idle.
type workers struct {
	idle chan func() // unbuffered: a send succeeds only if a worker waits
	n    atomic.Int32
	max  int32
}

func newWorkers(max int) *workers {
	return &workers{idle: make(chan func()), max: int32(max)}
}

// run runs f on a worker. It must not be called after close.
func (w *workers) run(f func()) {
	select {
	case w.idle <- f:
	default:
		go w.loop(f)
	}
}

func (w *workers) loop(f func()) {
	for f != nil {
		f()
		if w.n.Add(1) > w.max {
			w.n.Add(-1)
			return
		}
		f = <-w.idle // nil once closed
		w.n.Add(-1)
	}
}

// close lets the idle workers end; busy ones end after their work.
func (w *workers) close() { close(w.idle) }
