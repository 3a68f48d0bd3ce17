package e2e_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// testTier is a [tiertest.Harness] with this package's own helpers on
// it: devices of package agent, run against the tier.
type testTier struct{ *tiertest.Harness }

// newTestTier starts a tier configured by o with tiertest.Start.
func newTestTier(t testing.TB, o tier.Options) *testTier {
	t.Helper()
	return &testTier{tiertest.Start(t, o)}
}

// runningDevice is an agent.Device running on its own goroutine.
type runningDevice struct {
	node   string
	ready  <-chan struct{} // a value after each accepted announce but the first
	cancel context.CancelFunc
	done   chan error
}

// runDevice runs an agent.Device with o (URLs, Token and Schemas filled in
// when empty) until the test ends, and returns once the tier accepted its
// announce.
func (tt *testTier) runDevice(t testing.TB, o agent.Options) *runningDevice {
	t.Helper()
	if len(o.URLs) == 0 {
		o.URLs = []string{tt.URL}
	}
	if o.Token == "" {
		o.Token = tt.Token(t, o.NodeID)
	}
	if o.Schemas == nil {
		o.Schemas = tt.Schemas
	}
	ready := make(chan struct{}, 1)
	o.OnReady = func([]string) {
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	d, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	rd := &runningDevice{node: o.NodeID, ready: ready, cancel: cancel, done: make(chan error, 1)}
	go func() { rd.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		if err := rd.stop(); err != nil {
			t.Errorf("device %s: %v", rd.node, err)
		}
	})
	select {
	case <-ready:
	case err := <-rd.done:
		rd.done <- err // for stop
		t.Fatalf("device %s stopped before it was ready: %v", rd.node, err)
	case <-time.After(tiertest.WaitFor):
		t.Fatalf("device %s not ready", rd.node)
	}
	return rd
}

// runMock runs a simulated device with the echo capability: a well-behaved
// bystander.
func (tt *testTier) runMock(t testing.TB) *runningDevice {
	t.Helper()
	return tt.runDevice(t, agent.MockOptions(wire.NewNodeID(), tt.Schemas, 1))
}

// stop ends the device and returns what Run returned. It may be called
// more than once.
func (rd *runningDevice) stop() error {
	rd.cancel()
	select {
	case err := <-rd.done:
		rd.done <- err
		return err
	case <-time.After(tiertest.WaitFor):
		return errors.New("Run did not return")
	}
}

// wait blocks until release is closed or the test ends, whichever comes
// first: a handler that waits with it never outlives a failed test.
func wait(t *testing.T, release <-chan struct{}) {
	select {
	case <-release:
	case <-t.Context().Done():
	}
}
