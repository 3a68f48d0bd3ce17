package agent_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// closedURL returns the device URL of a port of 127.0.0.1 nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "ws://" + addr + wire.Path
}

// TestDeviceSaysWhyItFailed: each attempt that does not reach the tier is
// reported to OnFail with why: the connection refused, or a close code of
// the protocol with its meaning; a refusal for good is Run's error, with
// the close code's meaning, and no OnFail.
func TestDeviceSaysWhyItFailed(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, url string) (fails <-chan error, done <-chan error) {
		t.Helper()
		o := agent.MockOptions(wire.NewNodeID(), set, 1)
		o.URLs, o.Token = []string{url}, "unchecked"
		f := make(chan error, 16)
		o.OnFail = func(err error) {
			select {
			case f <- err:
			default:
			}
		}
		d, err := agent.New(o)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		dc, ended := make(chan error, 1), make(chan struct{})
		go func() {
			defer close(ended)
			dc <- d.Run(ctx)
		}()
		t.Cleanup(func() {
			cancel()
			select {
			case <-ended:
			case <-time.After(waitFor):
				t.Error("device Run did not return")
			}
		})
		return f, dc
	}
	firstFail := func(t *testing.T, fails <-chan error, want string) {
		t.Helper()
		select {
		case err := <-fails:
			if !strings.Contains(err.Error(), want) {
				t.Errorf("OnFail(%v), want it to say %q", err, want)
			}
		case <-time.After(waitFor):
			t.Fatalf("no OnFail, want one saying %q", want)
		}
	}

	t.Run("connection refused", func(t *testing.T) {
		fails, _ := run(t, closedURL(t))
		firstFail(t, fails, "connection refused")
	})
	t.Run("4429 after hello", func(t *testing.T) {
		rt := newRawTier(t, set)
		fails, _ := run(t, rt.url)
		closeAfterAuth(t, rt, wire.CloseTooMany, "slow down")
		firstFail(t, fails, "4429 (too many connection attempts)")
	})
	t.Run("4401 for lateness comes back", func(t *testing.T) {
		rt := newRawTier(t, set)
		fails, done := run(t, rt.url)
		tc := rt.accept(t)
		tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
		tc.recv(t, wire.TypeAuth, nil)
		tc.send(t, wire.TypeError, "", wire.ErrorFrame{Code: schemas.CodeDeadlineExceeded, Message: "authentication timeout"})
		tc.c.Close(wire.CloseAuthFailed, "authentication timeout")
		firstFail(t, fails, "4401 (authentication failed or late): authentication timeout")
		rt.accept(t) // the device tries again
		select {
		case err := <-done:
			t.Errorf("Run returned %v after a late 4401, want it to try again", err)
		default:
		}
	})
	t.Run("4401 refuses for good", func(t *testing.T) {
		rt := newRawTier(t, set)
		fails, done := run(t, rt.url)
		closeAfterAuth(t, rt, wire.CloseAuthFailed, "token expired")
		select {
		case err := <-done:
			var ce *agent.CloseError
			if !errors.As(err, &ce) || ce.Code != wire.CloseAuthFailed ||
				!strings.Contains(err.Error(), "4401 (authentication failed or late): token expired") {
				t.Errorf("Run returned %v, want the 4401 with its meaning and reason", err)
			}
		case <-time.After(waitFor):
			t.Fatal("Run did not return after a 4401")
		}
		select {
		case err := <-fails:
			t.Errorf("OnFail(%v) for a refusal for good", err)
		default:
		}
	})
}

// closeAfterAuth accepts a device on rt, says hello, reads its auth, and
// closes the session with code and reason.
func closeAfterAuth(t *testing.T, rt *rawTier, code websocket.StatusCode, reason string) {
	t.Helper()
	tc := rt.accept(t)
	tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
	tc.recv(t, wire.TypeAuth, nil)
	tc.c.Close(code, reason)
}
