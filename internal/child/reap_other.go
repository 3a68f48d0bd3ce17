//go:build !linux

package child

import (
	"context"
	"os"
	"os/exec"
)

// Subreapers are Linux's: elsewhere an upstream's orphans go to init.

// BecomeSubreaper is a no-op but on Linux.
func BecomeSubreaper() error { return nil }

// ReapOrphans is a no-op but on Linux: it waits for ctx and returns nil.
func ReapOrphans(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func startTracked(cmd *exec.Cmd) error { return cmd.Start() }

func untrack(int) {}

func endEscaped([]uint64) {}

func pipeInode(*os.File) uint64 { return 0 }
