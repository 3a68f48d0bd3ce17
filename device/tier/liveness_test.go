package tier

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakePeer records when liveness pinged or dropped it; answer, if set,
// runs on each ping (on a goroutine of its own, as a pong would come).
type fakePeer struct {
	l      *liveness
	p      peer
	answer func()

	mu     sync.Mutex
	pings  []time.Time
	lostAt time.Time
}

func (f *fakePeer) ping() {
	f.mu.Lock()
	f.pings = append(f.pings, time.Now())
	f.mu.Unlock()
	if f.answer != nil {
		go f.answer()
	}
}

func (f *fakePeer) lost() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.lostAt.IsZero() {
		panic("lost twice")
	}
	f.lostAt = time.Now()
}

func (f *fakePeer) hear() { f.l.hear(&f.p) }

func (f *fakePeer) state() ([]time.Time, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.pings...), f.lostAt
}

// withLiveness runs test in a bubble with a liveness of interval (and as
// long a timeout) running.
func withLiveness(t *testing.T, interval time.Duration, test func(t *testing.T, l *liveness)) {
	withLivenessTimeout(t, interval, interval, test)
}

// withLivenessTimeout is withLiveness with another timeout.
func withLivenessTimeout(t *testing.T, interval, timeout time.Duration, test func(t *testing.T, l *liveness)) {
	synctest.Test(t, func(t *testing.T) {
		l := newLiveness(interval, timeout)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { l.run(ctx) })
		test(t, l)
		cancel()
		wg.Wait()
	})
}

const liveInterval = 15 * time.Second

// TestLivenessChattyNeverPinged: a device heard from more often than the
// interval (frames, or pings of its own) is never pinged nor dropped.
func TestLivenessChattyNeverPinged(t *testing.T) {
	withLiveness(t, liveInterval, func(t *testing.T, l *liveness) {
		f := &fakePeer{l: l}
		l.add(&f.p, f)
		for range 11 { // ten intervals
			time.Sleep(liveInterval * 9 / 10) // just under an interval
			f.hear()
		}
		synctest.Wait()
		if pings, lost := f.state(); len(pings) != 0 || !lost.IsZero() {
			t.Errorf("a device heard from every %v: pinged %d times, lost at %v; want never", liveInterval*9/10, len(pings), lost)
		}
	})
}

// TestLivenessSilentDropped: a device that falls silent (at once, or
// after answering some pings) is pinged once more, within the interval
// after it was last heard from; that ping has the whole timeout to be
// answered; the device is dropped at most interval+timeout after it was
// last heard from.
func TestLivenessSilentDropped(t *testing.T) {
	for _, c := range []struct{ interval, timeout time.Duration }{
		{liveInterval, liveInterval},
		{liveInterval * 3 / 2, liveInterval / 2}, // the same bound, fewer pings
		{time.Hour, liveInterval},
	} {
		for _, n := range []int{0, 1, 3} {
			t.Run(fmt.Sprintf("%v+%v/%d answers", c.interval, c.timeout, n), func(t *testing.T) {
				withLivenessTimeout(t, c.interval, c.timeout, func(t *testing.T, l *liveness) {
					answers := n
					f := &fakePeer{l: l}
					last := time.Now() // when the device was last heard from
					var mu sync.Mutex
					f.answer = func() {
						mu.Lock()
						defer mu.Unlock()
						if answers > 0 {
							answers--
							f.hear()
							last = time.Now()
						}
					}
					l.add(&f.p, f)
					time.Sleep(time.Duration(n+2) * (c.interval + c.timeout))
					synctest.Wait()
					mu.Lock()
					defer mu.Unlock()
					pings, lost := f.state()
					if len(pings) != n+1 {
						t.Fatalf("%d pings, want %d", len(pings), n+1)
					}
					ping := pings[len(pings)-1]
					if since := ping.Sub(last); since > c.interval || since < c.interval-2*l.tick {
						t.Errorf("last ping %v after the device was last heard from, want within the last two ticks of the %v interval", since, c.interval)
					}
					if lost.IsZero() {
						t.Fatal("a silent device was never dropped")
					}
					if since := lost.Sub(last); since > c.interval+c.timeout {
						t.Errorf("dropped %v after it was last heard from, want at most %v", since, c.interval+c.timeout)
					}
					if grace := lost.Sub(ping); grace < c.timeout {
						t.Errorf("dropped %v after its last ping, want the whole timeout (%v) to answer", grace, c.timeout)
					}
				})
			})
		}
	}
}

// TestLivenessAnswered: a device that answers each ping, however late
// within the interval, is never dropped, and is pinged once an interval:
// each ping counts from the last answer.
func TestLivenessAnswered(t *testing.T) {
	for _, delay := range []time.Duration{0, time.Second, liveInterval - time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			withLiveness(t, liveInterval, func(t *testing.T, l *liveness) {
				f := &fakePeer{l: l}
				var answered []time.Time
				var mu sync.Mutex
				f.answer = func() {
					time.Sleep(delay)
					f.hear()
					mu.Lock()
					answered = append(answered, time.Now())
					mu.Unlock()
				}
				joined := time.Now()
				l.add(&f.p, f)
				time.Sleep(20 * liveInterval)
				synctest.Wait()
				pings, lost := f.state()
				if !lost.IsZero() {
					t.Fatalf("a device that answers its pings after %v was dropped", delay)
				}
				mu.Lock()
				defer mu.Unlock()
				want := int(20 * liveInterval / (liveInterval + delay))
				if len(pings) < want || len(pings) > want+1 {
					t.Errorf("%d pings over 20 intervals, answered after %v: want %d", len(pings), delay, want)
				}
				last := joined
				for i, p := range pings {
					if since := p.Sub(last); since > liveInterval || since < liveInterval-2*l.tick {
						t.Errorf("ping %d came %v after the device was last heard from, want just under %v", i, since, liveInterval)
					}
					if i < len(answered) {
						last = answered[i]
					}
				}
			})
		})
	}
}

// TestLivenessRemoved: a session that ended is neither pinged nor dropped
// afterwards.
func TestLivenessRemoved(t *testing.T) {
	withLiveness(t, liveInterval, func(t *testing.T, l *liveness) {
		f := &fakePeer{l: l}
		l.add(&f.p, f)
		time.Sleep(liveInterval / 2)
		l.remove(&f.p)
		time.Sleep(3 * liveInterval)
		synctest.Wait()
		if pings, lost := f.state(); len(pings) != 0 || !lost.IsZero() {
			t.Errorf("a removed peer was pinged %d times, lost at %v; want neither", len(pings), lost)
		}
	})
}

// TestLivenessMany: many peers, added at all times, each pinged once an
// interval and none dropped while they answer; the silent ones among
// them dropped in time.
func TestLivenessMany(t *testing.T) {
	withLiveness(t, liveInterval, func(t *testing.T, l *liveness) {
		const n = 500
		peers := make([]*fakePeer, n)
		joined := make([]time.Time, n)
		for i := range peers {
			f := &fakePeer{l: l}
			if i%5 != 0 { // every fifth never answers
				f.answer = f.hear
			}
			peers[i] = f
			joined[i] = time.Now()
			l.add(&f.p, f)
			time.Sleep(liveInterval / n * 3)
		}
		time.Sleep(4 * liveInterval)
		synctest.Wait()
		for i, f := range peers {
			pings, lost := f.state()
			switch {
			case i%5 == 0 && (lost.IsZero() || lost.Sub(joined[i]) > 2*liveInterval || len(pings) != 1):
				t.Errorf("silent peer %d: %d pings, lost %v after it joined; want 1 ping and a drop within %v",
					i, len(pings), lost.Sub(joined[i]), 2*liveInterval)
			case i%5 != 0 && !lost.IsZero():
				t.Errorf("peer %d answers its pings, and was dropped", i)
			}
		}
	})
}
