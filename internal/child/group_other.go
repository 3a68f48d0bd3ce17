//go:build !linux

package child

import (
	"os/exec"
	"syscall"
)

// Process groups are Linux's here: elsewhere the tier ends the process it
// started, and what that process started is the process's to end.

func setGroup(*exec.Cmd) {}

func lockThread() (unlock func()) { return func() {} }

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		_ = cmd.Process.Kill()
		return
	}
	_ = cmd.Process.Signal(sig)
}

func endGroup(int) {}
