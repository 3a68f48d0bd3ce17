package remote_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/okso-io/okso/internal/child"
	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
)

// groupGone fails t unless no process is left in the process group pgid.
func groupGone(t *testing.T, pgid int) {
	t.Helper()
	if err := syscall.Kill(-pgid, 0); err != syscall.ESRCH {
		t.Errorf("process group %d: kill(-pgid, 0) = %v, want ESRCH", pgid, err)
	}
}

// zombies lists this process's children that exited unreaped.
func zombies(t *testing.T) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	me := os.Getpid()
	var out []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ")".
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] != "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == me {
			pid, _ := strconv.Atoi(strings.Fields(s)[0])
			out = append(out, pid)
		}
	}
	return out
}

// parent returns the parent of process pid, or 0 when it is gone.
func parent(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// dialEscaping starts the test upstream behind a shell that double-forks
// sleeper (a command) into a session of its own, out of the upstream's
// process group, as a helper that daemonises does. It returns the client
// the upstream's process id and the sleeper's, once this process adopted
// the sleeper (it is a subreaper, see TestMain) or the sleeper is gone.
func dialEscaping(t *testing.T, sleeper string) (_ remote.Client, leader, pid int) {
	t.Helper()
	t.Cleanup(func() { // a test that fails leaves no sleeper behind
		if pid != 0 && parent(pid) == os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, 0, nil)
		}
	})
	state := t.TempDir()
	argv, env := testupstream.Command(testupstream.Options{State: state})
	c, err := remote.DialStdio(bounded(t), remote.StdioOptions{
		Command: []string{"sh", "-c", `(setsid ` + sleeper + ` & echo $! > "$OKSO_TESTUPSTREAM_STATE/sleep"); exec "$0"`, argv[0]},
		Env:     env, Log: testLog(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if leader, err = testupstream.PID(state); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(state + "/sleep")
	if err != nil {
		t.Fatal(err)
	}
	if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		t.Fatal(err)
	}
	if sid, err := unix.Getsid(pid); err == nil && (sid != pid || sid == leader) {
		t.Fatalf("the sleeper's session is %d, want one of its own", sid)
	}
	eventually(t, "the sleeper adopted", func() bool {
		p := parent(pid)
		return p == os.Getpid() || p == 0
	})
	return c, leader, pid
}

// gone fails t unless process pid is gone, reaped.
func gone(t *testing.T, pid int, what string) {
	t.Helper()
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("%s: kill(%d, 0) = %v, want ESRCH (gone and reaped)", what, pid, err)
	}
}

// TestStdioEscapedEnded: a helper that escaped its upstream's process
// group and session but holds the upstream's pipes, adopted by the tier's
// process, is ended and reaped with the upstream, whether it is closed or
// dies.
func TestStdioEscapedEnded(t *testing.T) {
	for _, tc := range upstreamEnds {
		t.Run(tc.name, func(t *testing.T) {
			c, leader, sleeper := dialEscaping(t, "sleep 600")
			tc.end(t, c, leader)
			gone(t, sleeper, "the escaped sleeper, once its upstream ended")
			// Its own processes only: other tests' orphans, adopted by
			// this process once a test made it a subreaper, are not this
			// test's to count.
			gone(t, leader, "the upstream")
		})
	}
}

// TestReapOrphans: an adopted orphan that exits is reaped at once, not
// left a zombie while its upstream runs; one that holds none of the
// upstream's pipes is ended and reaped when ReapOrphans stops.
func TestReapOrphans(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		err = child.ReapOrphans(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-reaped
	})

	_, _, short := dialEscaping(t, "sleep 0.1 </dev/null >/dev/null 2>&1")
	eventually(t, "the orphan that exited reaped", func() bool { return syscall.Kill(short, 0) == syscall.ESRCH })

	_, _, long := dialEscaping(t, "sleep 600 </dev/null >/dev/null 2>&1")
	if syscall.Kill(long, 0) != nil {
		t.Fatal("the long sleeper is gone already")
	}
	cancel()
	select {
	case <-reaped:
		if err != nil {
			t.Errorf("ReapOrphans: %v", err)
		}
	case <-time.After(waitLong):
		t.Fatal("ReapOrphans did not return")
	}
	gone(t, long, "an adopted orphan, once ReapOrphans stopped")
	if z := zombies(t); len(z) > 0 {
		t.Errorf("zombies left: %v", z)
	}
}
