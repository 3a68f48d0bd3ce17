package certfile

import "time"

// SetClock makes p read the time from now: a test moves it past
// CheckEvery instead of waiting for it.
func SetClock(p *Pair, now func() time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.now = now
}
