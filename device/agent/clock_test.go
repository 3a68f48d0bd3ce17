package agent

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestTierClock: the device reckons the tier's clock from auth_ok on its
// own monotonic clock, and allows for drift as time goes on.
func TestTierClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const tierMs = 1_800_000_000_000 // the tier's clock, whatever the device's says
		k := tierClock{ms: tierMs, at: time.Now()}
		if left := k.left(time.Now(), tierMs+2000); left != 2*time.Second+clockSlack(0) {
			t.Errorf("left at auth_ok: %v, want 2s and the slack", left)
		}
		if left := k.left(time.Now(), tierMs-20); left > 0 {
			t.Errorf("a deadline 20 ms before auth_ok: %v left, want none", left)
		}
		time.Sleep(time.Second) // the bubble's clock: no real wait
		if left := k.left(time.Now(), tierMs+2000); left != time.Second+clockSlack(time.Second) {
			t.Errorf("left a second later: %v, want 1s and the slack", left)
		}
		time.Sleep(10 * time.Hour)
		now := time.Now()
		since := now.Sub(k.at)
		tierNow := tierMs + since.Milliseconds()
		if left := k.left(now, tierNow-3000); left <= 0 {
			t.Errorf("10 h after auth_ok, 3 s late is within the drift allowance %v, got %v left", clockSlack(since), left)
		}
		if left := k.left(now, tierNow-5000); left > 0 {
			t.Errorf("10 h after auth_ok, 5 s late is beyond the drift allowance %v, got %v left", clockSlack(since), left)
		}
	})
}
