//go:build linux

package agent_test

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitGone waits, at most waitFor, for the process pid to end (a zombie
// has ended), by its pidfd, which becomes readable when it does.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return // gone, and reaped, already
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(waitFor/time.Millisecond))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			t.Fatalf("poll the pidfd of %d: %v", pid, err)
		case n == 0:
			t.Fatalf("the tool's sleeper %d still runs %v after the call ended", pid, waitFor)
		}
		return
	}
}
