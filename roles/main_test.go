package roles

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// part, device, stream and client a test starts must have stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
