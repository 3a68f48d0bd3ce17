package child

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
)

// setGroup makes the process the leader of a process group of its own,
// so that it can be ended with every process it started, and has the
// kernel kill it should the tier die without a word.
func setGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// lockThread locks the calling goroutine to its thread until unlock.
// The parent-death signal follows the thread that started the process,
// not the tier (prctl(2)): Go may end an idle thread, so the process is
// started, and waited for, on a thread that is kept meanwhile.
func lockThread() (unlock func()) {
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}

// signalGroup sends sig to every process of cmd's group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	_ = syscall.Kill(-cmd.Process.Pid, sig)
}

// endGroup kills what is left of the group led by pid, which has been
// reaped already, and reaps the members that are our children: the
// processes its leader started, once they are orphans, when okso is their
// reaper (PID 1 in a container, or a subreaper).
func endGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(-pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) && err != nil {
			return // ECHILD: no child of ours is left in the group
		}
	}
}
