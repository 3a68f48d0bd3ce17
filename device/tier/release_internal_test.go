package tier

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestStormsRelease: the memory is given back once per storm, only after
// a storm, and only once no handshake has ended for stormQuiet.
func TestStormsRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var freed atomic.Int32
		s := &storms{free: func() { freed.Add(1) }}
		want := func(n int32, when string) {
			t.Helper()
			synctest.Wait()
			if got := freed.Load(); got != n {
				t.Fatalf("%s: released %d times, want %d", when, got, n)
			}
		}
		for range stormHandshakes - 1 {
			s.ended()
		}
		time.Sleep(10 * stormQuiet)
		want(0, "after fewer handshakes than a storm")

		s.ended() // the storm's last but one
		time.Sleep(stormQuiet - time.Millisecond)
		s.ended() // the storm goes on: the quiet starts again
		time.Sleep(stormQuiet - time.Millisecond)
		want(0, "while handshakes still end")
		time.Sleep(2 * time.Millisecond)
		want(1, "after the storm")

		for range stormHandshakes - 1 {
			s.ended()
		}
		time.Sleep(10 * stormQuiet)
		want(1, "after a few handshakes more")
		s.ended()
		time.Sleep(stormQuiet)
		want(2, "after a second storm")
	})
}
