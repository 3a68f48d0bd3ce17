package wire

import (
	"testing"
	"time"
)

// TestWriteGuardStalls: a write that never ends trips the guard.
func TestWriteGuardStalls(t *testing.T) {
	stalled := make(chan struct{})
	g := NewWriteGuard(10*time.Millisecond, func() { close(stalled) })
	g.Begin()
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("a write pending for 10 s did not trip a 10 ms guard")
	}
}

// TestWriteGuardArmed: the guard is armed exactly while writes are
// pending, and each write that ends re-arms it for the others.
func TestWriteGuardArmed(t *testing.T) {
	g := NewWriteGuard(time.Hour, func() { t.Error("stalled") })
	armed := func() bool {
		if g.timer == nil { // made by the first write
			return false
		}
		if g.timer.Stop() { // stopped now, so re-arm as it was
			g.timer.Reset(g.timeout)
			return true
		}
		return false
	}
	if armed() {
		t.Fatal("armed before any write")
	}
	g.Begin()
	g.Begin()
	if !armed() {
		t.Fatal("not armed with two writes pending")
	}
	g.End(true)
	if !armed() {
		t.Fatal("not armed with one write still pending")
	}
	g.End(true)
	if armed() {
		t.Fatal("armed after the last write ended")
	}
}

// TestWriteGuardFailureIsNoProgress: a write that fails while another is
// stalled does not give the stalled one more time.
func TestWriteGuardFailureIsNoProgress(t *testing.T) {
	stalled := make(chan struct{})
	g := NewWriteGuard(50*time.Millisecond, func() { close(stalled) })
	g.Begin() // stalls
	stop := make(chan struct{})
	defer close(stop)
	go func() { // fails, again and again
		for {
			select {
			case <-stop:
				return
			default:
			}
			g.Begin()
			g.End(false)
		}
	}()
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("failing writes kept a stalled one alive")
	}
}
