//go:build unix

package bus

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockStore takes an exclusive lock on dir (a file "lock" in it) for as
// long as the process holds the returned file: two nats-servers on one
// JetStream store would corrupt it. The kernel lets go of the lock when
// the process dies.
func lockStore(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock jetstream store %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("jetstream store %s is in use by another process "+
				"(another okso with the same --data-dir and NATS server name?)", dir)
		}
		return nil, fmt.Errorf("lock jetstream store %s: %w", dir, err)
	}
	return f, nil
}
