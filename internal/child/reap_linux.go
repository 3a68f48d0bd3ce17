package child

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// An upstream's process may start processes that leave its process group
// and its session (a helper that daemonises: fork, setsid, fork). The
// kernel gives such an orphan to the nearest subreaper, else to init.
// okso remote makes itself that subreaper ([BecomeSubreaper]), as it is
// init in a container: then it reaps the orphans it adopts when they exit
// ([ReapOrphans]), ends those that still hold an upstream's pipes when the
// upstream's process ends (endEscaped), and, as the kernel does when a
// container's init exits, ends the others when it stops.
//
// The orphans are told from the processes okso started by a register of
// the latter: a child is a child of the process, whoever in it started
// it, so the register is the process's, not a tier's. The reaper also
// leaves alone every child in okso's own process group, which is where
// os/exec puts the processes other code of the process starts.

// started registers the processes Start started, until they are
// waited for. starting is held, shared, from a start until its process
// is registered, and exclusively by a sweep: a sweep never takes a
// process just started for an orphan.
var started = struct {
	starting sync.RWMutex
	mu       sync.Mutex
	pids     map[int]bool
}{pids: map[int]bool{}}

// startTracked starts cmd and registers its process.
func startTracked(cmd *exec.Cmd) error {
	started.starting.RLock()
	defer started.starting.RUnlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	started.mu.Lock()
	started.pids[cmd.Process.Pid] = true
	started.mu.Unlock()
	return nil
}

// untrack forgets a started process once it has been waited for.
func untrack(pid int) {
	started.mu.Lock()
	delete(started.pids, pid)
	started.mu.Unlock()
}

func isStarted(pid int) bool {
	started.mu.Lock()
	defer started.mu.Unlock()
	return started.pids[pid]
}

// BecomeSubreaper makes this process the reaper of the orphans of the
// processes it starts (PR_SET_CHILD_SUBREAPER): an upstream's helper that
// escapes its process group and session comes to okso, not to init, to
// be reaped and ended by [ReapOrphans] and when its upstream ends. Call
// it before any upstream starts, with ReapOrphans running for as long as
// the process starts upstreams. It is a no-op but on Linux.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return os.NewSyscallError("prctl(PR_SET_CHILD_SUBREAPER)", err)
	}
	return nil
}

// adopting reports whether orphans come to this process: it is a
// subreaper, or init.
func adopting() bool {
	if os.Getpid() == 1 {
		return true
	}
	var on int32
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&on)), 0)
	return errno == 0 && on != 0
}

// ReapOrphans reaps, until ctx ends, the orphans this process adopted
// (see [BecomeSubreaper]) as they exit; then it ends those left, as the
// kernel ends a container's processes when its init exits, and returns
// once they are reaped. It returns nil. It is a no-op but on Linux.
func ReapOrphans(ctx context.Context) error {
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)
	sweep(false) // those that exited before
	for {
		select {
		case <-ctx.Done():
			sweep(true)
			return nil
		case <-chld:
			sweep(false)
		}
	}
}

// endWait bounds how long the orphans killed when the tier stops, or
// with their upstream, are waited for: a process in uninterruptible
// sleep dies only when it wakes.
const endWait = time.Second

// sweep reaps the adopted orphans that exited and, with kill, kills the
// others and reaps them too.
func sweep(kill bool) {
	started.starting.Lock()
	defer started.starting.Unlock()
	var killed []int
	for _, pid := range orphans(nil) {
		if kill && syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
			continue
		}
		reap(pid, false)
	}
	for _, pid := range killed {
		reap(pid, true)
	}
}

// reap reaps pid if it has exited or, with wait, once it exits, within
// endWait.
func reap(pid int, wait bool) {
	deadline := time.Now().Add(endWait)
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case got != 0 || err != nil || !wait || time.Now().After(deadline):
			return // reaped, or no child of ours, or let be
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// endEscaped ends, and reaps, the orphans this process adopted that
// still hold one of the pipes pipes (their inodes) once their upstream's
// process and group are gone: helpers that escaped its group and session
// but not its stdin, stdout or stderr. Those they started come to this
// process as they die, and are ended in turn. Orphans that let go of the
// pipes are reaped when they exit, and ended when the tier stops
// ([ReapOrphans]).
func endEscaped(pipes []uint64) {
	if len(pipes) == 0 || !adopting() {
		return
	}
	for range 10 { // each round ends a generation
		started.starting.Lock()
		held := orphans(pipes)
		for _, pid := range held {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, pid := range held {
			reap(pid, true)
		}
		started.starting.Unlock()
		if len(held) == 0 {
			return
		}
	}
}

// orphans returns this process's children that it adopted: not started
// by Start, not in its process group, and, when pipes is not nil,
// holding one of them. The caller holds started.starting.
func orphans(pipes []uint64) []int {
	me, group := os.Getpid(), syscall.Getpgrp()
	var out []int
	for _, pid := range children(me) {
		if isStarted(pid) {
			continue
		}
		if pgid, err := syscall.Getpgid(pid); err != nil || pgid == group {
			continue // gone meanwhile, or a child of other code of ours
		}
		if pipes != nil && !holds(pid, pipes) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// children lists the children of process me: from its threads' children
// files when the kernel has them, else from every process's stat.
func children(me int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(me) + "/task/*/children")
	var out []int
	read := false
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		read = true
		for _, s := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(s); err == nil {
				out = append(out, pid)
			}
		}
	}
	if read {
		return out
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold anything, so split
		// after its last ")".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil && ppid == me {
			if pid, err := strconv.Atoi(strings.Fields(s[:i])[0]); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// holds reports whether process pid holds one of the pipes.
func holds(pid int, pipes []uint64) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil || !strings.HasPrefix(link, "pipe:[") {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pipe:["), "]"), 10, 64)
		if err != nil {
			continue
		}
		for _, p := range pipes {
			if ino == p {
				return true
			}
		}
	}
	return false
}

// pipeInode returns the inode of the pipe f is an end of, or 0.
func pipeInode(f *os.File) uint64 {
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
