// Package logwriter writes a server's log lines on a goroutine of its
// own, batching those that come while one write is under way, so that a
// busy server does not pay a write(2) per line. Make one with [New] over
// stderr, give it to a [log/slog] handler wrapped in [FlushOnError], and
// [Writer.Close] it when the process is done logging.
package logwriter

import (
	"context"
	"io"
	"log/slog"
	"sync"
)

// Writer writes a server's log lines on a goroutine of its own. Every
// call leaves two audit lines, and a write(2) each cost the process 3% of
// its CPU at full load; lines that come while one write is under way are
// written together by the next. A line waits for no timer: the writer
// wakes as soon as there is one, so a quiet server's lines go out as
// before, one by one and at once. Lines keep their order. When
// maxBacklog bytes wait, Write waits too, so a stalled stderr slows the
// server rather than filling its memory. Flush waits for what waits to be
// written (an error line is flushed so: the process may be about to die).
// Close writes what waits; after it, Write writes through. Make one with
// [New]; it is safe for concurrent use.
type Writer struct {
	w io.Writer

	mu      sync.Mutex
	drained sync.Cond // signalled when the backlog is taken
	written sync.Cond // signalled when a taken backlog is written
	backlog []byte
	closed  bool
	// queued counts the bytes ever queued, done those ever written.
	queued, done int64

	kick      chan struct{} // a line waits; capacity 1
	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

// maxBacklog bounds the bytes waiting to be written.
const maxBacklog = 1 << 20

// New returns a Writer writing to w, and starts its goroutine, which
// [Writer.Close] ends.
func New(w io.Writer) *Writer {
	l := &Writer{w: w, kick: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	l.drained.L, l.written.L = &l.mu, &l.mu
	go l.run()
	return l
}

// Write queues p, which slog hands over as one whole line.
func (l *Writer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.backlog) >= maxBacklog && !l.closed {
		l.drained.Wait()
	}
	if l.closed {
		return l.w.Write(p)
	}
	l.backlog = append(l.backlog, p...)
	l.queued += int64(len(p))
	select {
	case l.kick <- struct{}{}:
	default: // already kicked
	}
	return len(p), nil
}

func (l *Writer) run() {
	defer close(l.stopped)
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
		l.mu.Lock()
		l.done += int64(len(b))
		l.written.Broadcast()
		l.mu.Unlock()
		if cap(b) <= 64<<10 { // keep a small buffer, not a burst's
			spare = b
		} else {
			spare = nil
		}
	}
}

// Flush returns once every line written before it is written out.
func (l *Writer) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for target := l.queued; l.done < target && !l.closed; {
		l.written.Wait()
	}
}

// Close writes the lines still waiting; later lines are written through.
func (l *Writer) Close() {
	l.closeOnce.Do(func() { close(l.stop) })
	<-l.stopped
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if len(l.backlog) > 0 {
		_, _ = l.w.Write(l.backlog)
		l.done += int64(len(l.backlog))
		l.backlog = nil
	}
	l.drained.Broadcast()
	l.written.Broadcast()
}

// FlushOnError returns a handler that passes records to h and flushes
// out after each at error level or above, so that such a line is out
// before a crash that may follow it. h writes to out.
func FlushOnError(h slog.Handler, out *Writer) slog.Handler {
	return flushOnError{h, out}
}

type flushOnError struct {
	slog.Handler
	out *Writer
}

func (h flushOnError) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= slog.LevelError {
		h.out.Flush()
	}
	return err
}

func (h flushOnError) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushOnError{h.Handler.WithAttrs(attrs), h.out}
}

func (h flushOnError) WithGroup(name string) slog.Handler {
	return flushOnError{h.Handler.WithGroup(name), h.out}
}
