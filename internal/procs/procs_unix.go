//go:build unix

package procs

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system) the process has used,
// or nil where it cannot be read.
func processCPU() func() time.Duration {
	return func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return 0
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
}
