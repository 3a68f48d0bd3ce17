package tier

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// liveness decides which devices to ping and which to drop, from when
// the tier last heard each of them: any frame, a ping of the device's own
// or a pong counts. A device heard from within the last interval is not
// pinged at all, so a device that talks (or pings on its own) costs the
// tier no keepalive traffic of its own. One heard from for no whole
// interval is pinged once, and has timeout to answer: one still silent
// interval+timeout after it was last heard from is dropped.
//
// Its work grows with the pings it sends, not with the devices it
// watches: each shard keeps its peers on a wheel of slots, one per tick,
// and visits a peer only when it could be due (about once an interval,
// and every tick while its ping is unanswered), on one goroutine per
// shard rather than a timer per session. Make one
// with [newLiveness], start it with [liveness.run], add a peer when its
// session starts, and remove it when it ends. It is safe for concurrent
// use.
type liveness struct {
	tick      time.Duration
	pingAfter time.Duration // silence after which a peer is pinged
	dropAfter time.Duration // silence after which it is dropped
	epoch     time.Time
	shards    []*liveShard
	next      atomic.Uint32 // the shard of the next peer, round robin
}

// liveTicks is how many ticks the shorter of interval and timeout has: a
// peer is visited up to a tick after it becomes due, so the thresholds
// are a tick or two short to keep the bounds.
const liveTicks = 64

// maxLiveSlots bounds a wheel's slots: with an interval far longer than
// the timeout, ticks are longer than liveTicks alone would make them.
const maxLiveSlots = 4096

// liveShards is how many wheels share the peers: each ticks on its own
// goroutine, at its own random offset, so their work does not come at
// once.
const liveShards = 4

// A livePeer is a session as liveness sees it: ping sends its device a
// ping, lost closes it with 4408. Neither may block.
type livePeer interface {
	ping()
	lost()
}

// A peer is one watched session.
type peer struct {
	heard atomic.Int64 // nanoseconds since epoch, of the last frame heard
	shard *liveShard
	// Under shard.mu:
	who    livePeer // nil once removed
	pinged int64    // the heard value the last ping was sent for
}

// newLiveness returns a liveness that pings peers silent for about
// interval, and drops those silent for interval+timeout.
func newLiveness(interval, timeout time.Duration) *liveness {
	tick := max(min(interval, timeout)/liveTicks, (interval+timeout)/maxLiveSlots, time.Millisecond)
	l := &liveness{
		tick: tick,
		// Visited up to a tick late: pinged before the interval is over,
		// the ping then has at least timeout before the drop, and the
		// drop comes at most interval+timeout after the last frame.
		pingAfter: interval - 2*tick,
		dropAfter: interval + timeout - tick,
		epoch:     time.Now(),
	}
	// A peer is never scheduled further than pingAfter ahead.
	slots := int(l.pingAfter/tick) + 3
	for range liveShards {
		l.shards = append(l.shards, &liveShard{l: l, slots: make([][]*peer, slots),
			// A random offset, so that shards do not wake together.
			start: rand.Int64N(int64(tick))})
	}
	return l
}

// now is the time on the liveness clock.
func (l *liveness) now() int64 { return int64(time.Since(l.epoch)) }

// hear records a frame from p's device.
func (l *liveness) hear(p *peer) { p.heard.Store(l.now()) }

// add starts watching who, heard from now.
func (l *liveness) add(p *peer, who livePeer) {
	sh := l.shards[l.next.Add(1)%uint32(len(l.shards))]
	now := l.now()
	p.heard.Store(now)
	sh.mu.Lock()
	p.shard, p.who, p.pinged = sh, who, -1
	sh.scheduleLocked(p, now+int64(l.pingAfter))
	sh.mu.Unlock()
}

// remove stops watching p; it is neither pinged nor dropped after remove
// returns.
func (l *liveness) remove(p *peer) {
	sh := p.shard
	if sh == nil {
		return
	}
	sh.mu.Lock()
	p.who = nil // its slot forgets it when it comes round
	sh.mu.Unlock()
}

// run ticks every shard until ctx ends.
func (l *liveness) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, sh := range l.shards {
		wg.Go(func() { sh.run(ctx) })
	}
	wg.Wait()
}

// A liveShard is one wheel: slot n%len(slots) holds the peers to visit at
// tick n, at start + n×tick on the liveness clock.
type liveShard struct {
	l     *liveness
	start int64 // the liveness time of tick 0; read-only
	mu    sync.Mutex
	// cursor is the next tick to visit; every peer is in the slot of a
	// tick from cursor to cursor+len(slots)-2 (the slot of cursor-1 is
	// the one being visited).
	cursor int64
	slots  [][]*peer
	// ping and drop are visit's, kept for the next tick.
	ping, drop []livePeer
}

// scheduleLocked puts p in the slot of the first tick at or after at, the
// cursor's at the soonest.
func (sh *liveShard) scheduleLocked(p *peer, at int64) {
	tick := int64(sh.l.tick)
	n := (at - sh.start + tick - 1) / tick
	n = min(max(n, sh.cursor), sh.cursor+int64(len(sh.slots))-2)
	i := n % int64(len(sh.slots))
	sh.slots[i] = append(sh.slots[i], p)
}

func (sh *liveShard) run(ctx context.Context) {
	t := time.NewTimer(time.Duration(sh.start - sh.l.now()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := sh.visit(sh.l.now())
		// The next tick on the wheel's own schedule, whatever this one cost.
		t.Reset(time.Duration(max(next-sh.l.now(), 0)))
	}
}

// visit goes through every tick due by now, deciding for each of their
// peers, and returns when the next tick is due.
func (sh *liveShard) visit(now int64) (next int64) {
	tick := int64(sh.l.tick)
	sh.mu.Lock()
	for sh.start+sh.cursor*tick <= now {
		i := sh.cursor % int64(len(sh.slots))
		due := sh.slots[i]
		sh.cursor++ // what is scheduled now goes to later slots, never to i
		for _, p := range due {
			if p.who == nil {
				continue
			}
			heard := p.heard.Load()
			switch silent := now - heard; {
			case silent >= int64(sh.l.dropAfter):
				sh.drop = append(sh.drop, p.who)
				p.who = nil
			case silent >= int64(sh.l.pingAfter):
				if p.pinged != heard {
					p.pinged = heard
					sh.ping = append(sh.ping, p.who)
				}
				// Until it answers, it is looked at every tick: its next
				// ping counts from the answer, not from this visit.
				sh.scheduleLocked(p, now)
			default:
				sh.scheduleLocked(p, heard+int64(sh.l.pingAfter))
			}
		}
		clear(due)
		sh.slots[i] = due[:0]
	}
	next = sh.start + sh.cursor*tick
	sh.mu.Unlock()
	for _, w := range sh.ping {
		w.ping()
	}
	for _, w := range sh.drop {
		w.lost()
	}
	clear(sh.ping)
	clear(sh.drop)
	sh.ping, sh.drop = sh.ping[:0], sh.drop[:0]
	return next
}
