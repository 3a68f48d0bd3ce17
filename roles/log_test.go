package roles

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// TestErrorLineSurvivesCrash: an error line a role logs just before the
// process dies is written, even on one P, where the log writer's own
// goroutine would not get to run first. The crash runs in a child
// process: this test binary again.
func TestErrorLineSurvivesCrash(t *testing.T) {
	const line = "the line that explains the crash"
	if os.Getenv("OKSO_TEST_CRASH") == "1" {
		runtime.GOMAXPROCS(1)
		l := &logFlags{level: "info", format: "json"}
		log, err := l.open(os.Stderr)
		if err != nil {
			panic(err)
		}
		log.Info("a line before it")
		log.Error(line)
		panic("crash")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestErrorLineSurvivesCrash$")
	cmd.Env = append(os.Environ(), "OKSO_TEST_CRASH=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("panic: crash")) {
		t.Fatalf("the child did not crash: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(line)) || !bytes.Contains(out, []byte("a line before it")) {
		t.Fatalf("lines logged before the crash are missing:\n%s", out)
	}
}
