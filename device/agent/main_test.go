package agent_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// device a test runs, and every tier it plays by hand, must have ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
