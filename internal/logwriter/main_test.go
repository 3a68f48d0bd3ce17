package logwriter

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// Writer's goroutine ends with its Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
