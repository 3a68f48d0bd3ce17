package remote_test

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
	"github.com/okso-io/okso/schemas"
)

// TestStdioGroupReaped: an upstream behind a shell that leaves a process
// of its own behind (sleep 600 &), as npx and sh wrappers do. Whether
// the tier closes it or it dies on its own, no process of its group is
// left, and none is left a zombie.
func TestStdioGroupReaped(t *testing.T) {
	for _, tc := range upstreamEnds {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			argv, env := testupstream.Command(testupstream.Options{State: state})
			c, err := remote.DialStdio(bounded(t), remote.StdioOptions{
				Command: []string{"sh", "-c", `sleep 600 & echo $! > "$OKSO_TESTUPSTREAM_STATE/sleep"; exec "$0"`, argv[0]},
				Env:     env, Log: testLog(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			leader, err := testupstream.PID(state) // sh exec'd it: the group's leader
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(state + "/sleep")
			if err != nil {
				t.Fatal(err)
			}
			sleeper, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			if pgid, err := syscall.Getpgid(sleeper); err != nil || pgid != leader {
				t.Fatalf("sleep's group = %d, %v; want the upstream's, %d", pgid, err, leader)
			}
			if leader == os.Getpid() || leader == syscall.Getpgrp() {
				t.Fatalf("the upstream shares the test's process group")
			}

			tc.end(t, c, leader)
			groupGone(t, leader)
			if z := zombies(t); len(z) > 0 {
				t.Errorf("zombies left: %v", z)
			}
		})
	}
}

// TestActionTimeoutEndsGroup: an endpoint past its timeout is killed with
// every process it started, and all of them are reaped.
func TestActionTimeoutEndsGroup(t *testing.T) {
	dir := t.TempDir()
	c := remote.NewAction(remote.ActionOptions{
		Command: []string{writeScript(t, `echo $$ > "$OUT/pid"; sleep 600 & sleep 600`)},
		Env:     map[string]string{"OUT": dir}, Timeout: 300 * time.Millisecond, Log: testLog(t),
	})
	defer c.Close()
	_, err := c.List(bounded(t))
	wantCode(t, err, schemas.CodeDeadlineExceeded, false)
	b, err := os.ReadFile(dir + "/pid")
	if err != nil {
		t.Fatal(err)
	}
	leader, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	groupGone(t, leader)
	if z := zombies(t); len(z) > 0 {
		t.Errorf("zombies left: %v", z)
	}
}

// upstreamEnds are the two ways a stdio upstream ends: the tier closes
// it, or it dies (killed by a signal).
var upstreamEnds = []struct {
	name string
	end  func(t *testing.T, c remote.Client, leader int)
}{
	{"closed", func(t *testing.T, c remote.Client, _ int) {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}},
	{"killed", func(t *testing.T, c remote.Client, leader int) {
		if err := syscall.Kill(leader, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, c.Done(), "Done after the upstream was killed")
	}},
}
