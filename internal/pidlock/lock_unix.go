//go:build unix

package pidlock

import (
	"errors"
	"os"
	"syscall"
)

// lock takes f's lock without waiting; held reports that another hold
// has it.
func lock(f *os.File) (held bool, err error) {
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	return errors.Is(err, syscall.EWOULDBLOCK), err
}
