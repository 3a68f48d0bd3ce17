// Package pidlock is an exclusive lock on a file that says who holds it:
// the pid of the holding process and an id of the hold, so that a
// process refused the lock can name the holder, and a holder can learn
// that another process took over what the lock guards.
//
// [TryLock] takes the lock without waiting, or returns a [*HeldError]
// naming the holder. [Mark] writes a process's claim into the file
// without the lock (a process taking over says so); [Read] reads whose
// claim the file holds. The lock is the kernel's (flock on unix): it goes
// when the holder releases it or dies. Elsewhere nothing is locked.
package pidlock

import (
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Claim is what the file says of its holder.
type Claim struct {
	PID int    // 0: unknown
	ID  string // the hold's own id, unique to one TryLock or Mark
}

// HeldError is returned by [TryLock] when another hold has the lock.
type HeldError struct {
	Path   string
	Holder Claim // the file's claim, when one could be read
}

func (e *HeldError) Error() string {
	if e.Holder.PID > 0 {
		return fmt.Sprintf("%s is locked by process %d", e.Path, e.Holder.PID)
	}
	return fmt.Sprintf("%s is locked by another process", e.Path)
}

// Lock is one hold of the lock on a file. Release it once; it is not
// safe for concurrent use.
type Lock struct {
	f     *os.File // nil where nothing is locked
	claim Claim
}

// TryLock takes the lock on path (created, mode 0600, if needed) without
// waiting, and writes this process's claim into it. Two TryLocks of one
// path conflict even within one process.
func TryLock(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	held, err := lock(f)
	if err != nil {
		f.Close()
		if held {
			c, _ := Read(path)
			return nil, &HeldError{Path: path, Holder: c}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	c := newClaim()
	if err := write(f, c); err != nil {
		f.Close()
		return nil, fmt.Errorf("write lock %s: %w", path, err)
	}
	return &Lock{f: f, claim: c}, nil
}

// Claim returns the claim l wrote.
func (l *Lock) Claim() Claim { return l.claim }

// Release lets the lock go, leaving the file and its claim: a process
// that marked it taken over keeps its mark.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the file unlocks it
	l.f = nil
	return err
}

// Mark writes a new claim of this process into path without taking the
// lock, and returns it: the holder, reading the file, sees that another
// process took over.
func Mark(path string) (Claim, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return Claim{}, fmt.Errorf("open lock %s: %w", path, err)
	}
	defer f.Close()
	c := newClaim()
	if err := write(f, c); err != nil {
		return Claim{}, fmt.Errorf("write lock %s: %w", path, err)
	}
	return c, nil
}

// Read returns the claim in path. A file being rewritten may read empty:
// the zero Claim, no error.
func Read(path string) (Claim, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Claim{}, err
	}
	pid, id, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	n, err := strconv.Atoi(pid)
	if !ok || err != nil || n <= 0 || id == "" {
		return Claim{}, nil
	}
	return Claim{PID: n, ID: id}, nil
}

func newClaim() Claim { return Claim{PID: os.Getpid(), ID: rand.Text()} }

// write replaces f's contents with c, in place: renaming another file
// over it would leave the lock on the old one.
func write(f *os.File, c Claim) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(c.PID)+" "+c.ID+"\n"), 0)
	return err
}
