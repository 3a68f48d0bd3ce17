package certfile

import "time"

// SetClock makes p read the time from now: a test moves it past
// CheckEvery instead of waiting for it.
func SetClock(p *Pair, now func() time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.now = now
}

// SetBundleClock is SetClock for a Bundle.
func SetBundleClock(b *Bundle, now func() time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now = now
}
