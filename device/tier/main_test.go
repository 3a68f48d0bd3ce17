package tier_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// session, device, watch and server a test starts must have ended. No
// goroutine needs ignoring: the embedded nats-server (Shutdown waits for
// it), nats.go connections (Close), httptest servers (Close, which also
// drops http.DefaultTransport's idle connections) and coder/websocket all
// stop theirs before the tests return.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
