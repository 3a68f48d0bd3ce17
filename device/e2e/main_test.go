package e2e_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// tier, device, watch and server a test starts must have ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
