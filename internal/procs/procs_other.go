//go:build !unix

package procs

import "time"

// processCPU returns nil: the process's CPU time is not read here, and
// GOMAXPROCS stays Go's default.
func processCPU() func() time.Duration { return nil }
