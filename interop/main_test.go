package interop

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// binary is the okso binary the tests run, built once by TestMain (with
// the race detector, as make test builds everything), or the one named by
// $OKSO_INTEROP_BIN, to check another build against the same clients.
var binary string

// TestMain builds okso, runs the tests, and fails the package if a test
// leaves a goroutine behind.
func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "okso-interop-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cleanup := func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}
	switch {
	case os.Getenv("OKSO_INTEROP_BIN") != "":
		binary = os.Getenv("OKSO_INTEROP_BIN")
	case !testing.Short():
		binary = filepath.Join(dir, "okso")
		out, err := exec.Command("go", "build", "-race", "-o", binary, "github.com/okso-io/okso").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build okso: %v\n%s", err, out)
			cleanup(1)
		}
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(cleanup))
}
