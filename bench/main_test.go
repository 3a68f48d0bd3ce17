package bench

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// session, worker and connection a run opens must be gone when it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
