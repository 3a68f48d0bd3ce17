package remote_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/schemas"
)

// TestClassify: DESIGN.md §9.1's map, error by error, wrapped as the
// clients wrap them.
func TestClassify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("call t: %w", err) }
	status := func(s int) error { return &remote.HTTPStatusError{Status: s, Err: errors.New("refused")} }
	dial := func(errno syscall.Errno) error {
		return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/mcp", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}}
	}
	for _, tc := range []struct {
		name      string
		err       error
		code      string
		transient bool
	}{
		{"nil", nil, "", false},
		{"deadline", wrap(context.DeadlineExceeded), schemas.CodeDeadlineExceeded, false},
		{"cancelled", wrap(context.Canceled), schemas.CodeDeadlineExceeded, false},
		{"a deadline after a 503", &remote.HTTPStatusError{Status: 503, Err: context.DeadlineExceeded}, schemas.CodeDeadlineExceeded, false},
		{"not an object", wrap(remote.ErrNotObject), schemas.CodeManifestInvalid, false},
		{"401", wrap(status(401)), schemas.CodeSafetyDenied, false},
		{"403", wrap(status(403)), schemas.CodeSafetyDenied, false},
		{"502", wrap(status(502)), schemas.CodeNodeOffline, true},
		{"503", wrap(status(503)), schemas.CodeNodeOffline, true},
		{"504", wrap(status(504)), schemas.CodeNodeOffline, true},
		{"500", wrap(status(500)), schemas.CodeInternal, false},
		{"429", wrap(status(429)), schemas.CodeInternal, false},
		{"404, session lost", &remote.HTTPStatusError{Status: 404, Err: mcp.ErrSessionMissing}, schemas.CodeNodeOffline, false},
		{"process exited", wrap(remote.ErrProcessExited), schemas.CodeNodeOffline, true},
		{"connection refused", wrap(dial(syscall.ECONNREFUSED)), schemas.CodeNodeOffline, true},
		{"connection reset", wrap(dial(syscall.ECONNRESET)), schemas.CodeNodeOffline, true},
		{"EOF before an answer", wrap(&url.Error{Op: "Post", URL: "http://x", Err: io.EOF}), schemas.CodeNodeOffline, true},
		{"connection closed", wrap(mcp.ErrConnectionClosed), schemas.CodeNodeOffline, false},
		{"session missing", wrap(mcp.ErrSessionMissing), schemas.CodeNodeOffline, false},
		{"unknown tool", wrap(&jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: `unknown tool "x"`}), schemas.CodeToolNotFound, false},
		{"invalid params", wrap(&jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "validating arguments"}), schemas.CodeManifestInvalid, false},
		{"method not found", wrap(&jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "no"}), schemas.CodeInternal, false},
		{"an upstream's own error", wrap(&jsonrpc.Error{Code: -32000, Message: "boom"}), schemas.CodeInternal, false},
		{"EOF elsewhere", wrap(io.EOF), schemas.CodeInternal, false},
		{"anything else", errors.New("bad JSON"), schemas.CodeInternal, false},
	} {
		code, transient := remote.Classify(tc.err)
		if code != tc.code || transient != tc.transient {
			t.Errorf("%s: Classify(%v) = %q, %v; want %q, %v", tc.name, tc.err, code, transient, tc.code, tc.transient)
		}
		if code != "" && !schemas.KnownCode(code) {
			t.Errorf("%s: %q is not in the closed set", tc.name, code)
		}
	}
}
