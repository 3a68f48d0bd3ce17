package roles

import (
	"io"
	"sync"
)

// logWriter writes a server's log lines on a goroutine of its own. Every
// call leaves two audit lines, and a write(2) each cost the process 3% of
// its CPU at full load; lines that come while one write is under way are
// written together by the next. A line waits for no timer: the writer
// wakes as soon as there is one, so a quiet server's lines go out as
// before, one by one and at once. Lines keep their order. When
// maxLogBacklog bytes wait, Write waits too, so a stalled stderr slows the
// server rather than filling its memory. Close writes what waits; after
// it, Write writes through.
type logWriter struct {
	w io.Writer

	mu      sync.Mutex
	drained sync.Cond // signalled when the backlog is taken
	backlog []byte
	closed  bool

	kick      chan struct{} // a line waits; capacity 1
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// maxLogBacklog bounds the bytes waiting to be written.
const maxLogBacklog = 1 << 20

func newLogWriter(w io.Writer) *logWriter {
	l := &logWriter{w: w, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	l.drained.L = &l.mu
	go l.run()
	return l
}

// Write queues p, which slog hands over as one whole line.
func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.backlog) >= maxLogBacklog && !l.closed {
		l.drained.Wait()
	}
	if l.closed {
		return l.w.Write(p)
	}
	l.backlog = append(l.backlog, p...)
	select {
	case l.kick <- struct{}{}:
	default: // already kicked
	}
	return len(p), nil
}

func (l *logWriter) run() {
	defer close(l.done)
	var spare []byte
	for {
		select {
		case <-l.kick:
		case <-l.stop:
			return
		}
		l.mu.Lock()
		b := l.backlog
		l.backlog = spare[:0]
		l.drained.Broadcast()
		l.mu.Unlock()
		_, _ = l.w.Write(b)
		if cap(b) <= 64<<10 { // keep a small buffer, not a burst's
			spare = b
		} else {
			spare = nil
		}
	}
}

// Close writes the lines still waiting; later lines are written through.
func (l *logWriter) Close() {
	l.closeOnce.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if len(l.backlog) > 0 {
		_, _ = l.w.Write(l.backlog)
		l.backlog = nil
	}
	l.drained.Broadcast()
}
