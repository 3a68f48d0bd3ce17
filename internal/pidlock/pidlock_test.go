//go:build unix

package pidlock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestTryLock: a second hold of one path is refused, naming the first
// one's process, until the first lets go; a mark replaces the claim
// without the lock, and a release keeps it.
func TestTryLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	first, err := TryLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := Read(path); c != first.Claim() || c.PID != os.Getpid() || c.ID == "" {
		t.Errorf("the file says %+v, want %+v of pid %d", c, first.Claim(), os.Getpid())
	}
	_, err = TryLock(path)
	var held *HeldError
	if !errors.As(err, &held) || held.Holder != first.Claim() {
		t.Fatalf("second TryLock: %v, want a HeldError naming %+v", err, first.Claim())
	}

	mark, err := Mark(path)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := Read(path); c != mark || c.ID == first.Claim().ID {
		t.Errorf("after Mark the file says %+v, want %+v", c, mark)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	if c, _ := Read(path); c != mark {
		t.Errorf("the release changed the claim to %+v", c)
	}
	second, err := TryLock(path)
	if err != nil {
		t.Fatalf("TryLock after the release: %v", err)
	}
	if err := second.Release(); err != nil {
		t.Fatal(err)
	}
}
