package remote_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/okso-io/okso/internal/child"
	"github.com/okso-io/okso/remote/internal/testupstream"
)

// TestMain serves the test upstream when the binary runs as one (a stdio
// child of a test), and otherwise fails the package if a test leaves a
// goroutine behind: every session, process watcher and request must have
// ended. The test process is made the reaper of its descendants' orphans,
// as okso is in its container (PID 1), so that a test sees whether the
// processes an upstream started are reaped.
func TestMain(m *testing.M) {
	testupstream.Main()
	if err := child.BecomeSubreaper(); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}
