// Package repeats keeps a log bounded when its warnings and errors
// repeat, whatever a peer makes a server log: a [log/slog] handler that,
// in each period, writes the first record of a kind and counts the
// others, and at the period's end writes one line per kind with how many
// more there were. Make one with [New] over the handler that writes, and
// end each period with [Counts.Flush] (or [Counts.Run] on a ticker).
package repeats

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// MaxKinds bounds the kinds of line a Handler counts apart in one period,
// and so the lines it writes in it.
const MaxKinds = 64

// MsgOtherKinds is the message of the line that counts the repeats of
// kinds beyond MaxKinds.
const MsgOtherKinds = "more lines of other kinds"

// Handler keeps the warnings and errors of a log bounded when they
// repeat, whatever a peer sends: in each period of its Counts the
// first record of a kind (level, message, and the attributes and groups
// the logger was given) is written, the others of that kind are counted,
// and at the period's end one line of the same level and message says
// how many more there were ("more") in how long ("in_last"). A period
// counts at most MaxKinds kinds; records of further kinds are counted
// together, per level. Records below warn are all written: okso logs at
// info what it does itself (starts, links, summaries), never a line per
// peer message (the audit lines have their own bound: bus.Auditor's
// LogRepeats). It is safe for concurrent use; a record at warn or above
// takes one mutex, a record below it none.
type Handler struct {
	next slog.Handler
	kind string // the attributes and groups added to the logger
	rep  *Counts
}

// Counts is the count shared by a logger's Handlers; its period ends
// with each [Counts.Flush]. It is safe for concurrent use.
type Counts struct {
	root slog.Handler // writes the line of the kinds beyond MaxKinds

	mu    sync.Mutex
	since time.Time // start of the period
	kinds map[repeatKey]*repeated
}

type repeatKey struct {
	level     slog.Level
	msg, kind string
}

// repeated is a kind's count, and the handler that wrote its first line.
type repeated struct {
	h    slog.Handler
	more int
}

// New returns the handler of a logger writing to next, and the Counts of
// its repeats, whose first period begins at now.
func New(next slog.Handler, now time.Time) (Handler, *Counts) {
	p := &Counts{root: next, since: now, kinds: map[repeatKey]*repeated{}}
	return Handler{next: next, rep: p}, p
}

func (h Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn || h.rep.logs(h, r) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.kind)
	for _, a := range attrs {
		b.WriteString(" " + a.String())
	}
	return Handler{h.next.WithAttrs(attrs), b.String(), h.rep}
}

func (h Handler) WithGroup(name string) slog.Handler {
	return Handler{h.next.WithGroup(name), h.kind + " " + name + ":", h.rep}
}

// logs reports whether r is the first of its kind in the period, and
// counts it otherwise.
func (p *Counts) logs(h Handler, r slog.Record) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := repeatKey{r.Level, r.Message, h.kind}
	c := p.kinds[k]
	w := h.next
	if c == nil && len(p.kinds) >= MaxKinds {
		k = repeatKey{level: r.Level, msg: MsgOtherKinds}
		c, w = p.kinds[k], p.root
	}
	if c != nil {
		c.more++
		return false
	}
	p.kinds[k] = &repeated{h: w}
	return true
}

// Flush writes a line for each kind with records not written, and starts
// a new period at now.
func (p *Counts) Flush(now time.Time) {
	type line struct {
		k repeatKey
		c *repeated
	}
	p.mu.Lock()
	in := now.Sub(p.since).Round(time.Millisecond).String()
	var lines []line
	for k, c := range p.kinds {
		if c.more > 0 {
			lines = append(lines, line{k, c})
		}
	}
	clear(p.kinds)
	p.since = now
	p.mu.Unlock()
	slices.SortFunc(lines, func(a, b line) int { // in a stable order, for the reader
		return strings.Compare(a.k.kind+"\x00"+a.k.msg, b.k.kind+"\x00"+b.k.msg)
	})
	for _, l := range lines {
		r := slog.NewRecord(now, l.k.level, l.k.msg, 0)
		r.AddAttrs(slog.Int("more", l.c.more), slog.String("in_last", in))
		_ = l.c.h.Handle(context.Background(), r)
	}
}

// Run flushes at each tick until ctx ends, and once more then.
func (p *Counts) Run(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			p.Flush(time.Now())
			return
		case now := <-tick:
			p.Flush(now)
		}
	}
}
