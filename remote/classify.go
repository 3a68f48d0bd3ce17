package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/schemas"
)

// ErrProcessExited says that an upstream's process is gone: it exited or
// was killed before it answered. The call may be retried once the tier
// has started the process again.
var ErrProcessExited = errors.New("upstream process exited")

// ErrNotObject says that arguments or a payload were not a JSON object:
// they were refused before anything was sent or started.
var ErrNotObject = errors.New("not a JSON object")

// HTTPStatusError is an HTTP upstream's refusal of a request, with the
// status it answered; Err is the MCP client's error.
type HTTPStatusError struct {
	Status int
	Err    error
}

func (e *HTTPStatusError) Error() string {
	return fmt.Sprintf("upstream answered HTTP %d: %v", e.Status, e.Err)
}

func (e *HTTPStatusError) Unwrap() error { return e.Err }

// Classify maps an error of a [Client] to the closed set of codes
// (DESIGN.md §9.1), and says whether it is transient: whether a call to
// an idempotent tool may be tried again. Transient are a refused or reset
// connection, an HTTP 502, 503 or 504, and a process that died; nothing
// else. A nil error has no code.
//
//   - the upstream is down or unreachable (those, a closed connection, a
//     lost HTTP session): E_NODE_OFFLINE;
//   - the deadline passed, or the call was cancelled: E_DEADLINE_EXCEEDED;
//   - JSON-RPC -32602 "unknown tool": E_TOOL_NOT_FOUND; any other -32602,
//     or arguments that are not an object: E_MANIFEST_INVALID;
//   - HTTP 401 or 403: E_SAFETY_DENIED;
//   - anything else (HTTP 500 or 429, a malformed reply, an action that
//     failed): E_INTERNAL.
func Classify(err error) (code string, transient bool) {
	if err == nil {
		return "", false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return schemas.CodeDeadlineExceeded, false
	}
	if errors.Is(err, ErrNotObject) {
		return schemas.CodeManifestInvalid, false
	}
	var status *HTTPStatusError
	if errors.As(err, &status) {
		switch status.Status {
		case http.StatusUnauthorized, http.StatusForbidden:
			return schemas.CodeSafetyDenied, false
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return schemas.CodeNodeOffline, true
		}
	}
	if errors.Is(err, ErrProcessExited) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || resetBeforeAnswer(err) {
		return schemas.CodeNodeOffline, true
	}
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
		return schemas.CodeNodeOffline, false
	}
	var rpc *jsonrpc.Error
	if errors.As(err, &rpc) && rpc.Code == jsonrpc.CodeInvalidParams {
		// The Go SDK's words for a tool it does not serve (server.go); no
		// code tells it from a bad argument.
		if strings.HasPrefix(rpc.Message, "unknown tool") {
			return schemas.CodeToolNotFound, false
		}
		return schemas.CodeManifestInvalid, false
	}
	return schemas.CodeInternal, false
}

// resetBeforeAnswer reports whether err is an HTTP request whose
// connection ended before any answer: a reset by another name.
func resetBeforeAnswer(err error) bool {
	var u *url.Error
	return errors.As(err, &u) && (errors.Is(u.Err, io.EOF) || errors.Is(u.Err, io.ErrUnexpectedEOF))
}

// redactURL is an upstream's URL as okso logs it: scheme, host and path,
// never the credentials a userinfo or a query may hold.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment = nil, "", false, ""
	return u.String()
}

// scrub is err as okso logs it: the URL of every *url.Error in it
// redacted.
func scrub(err error) string {
	msg := err.Error()
	var ue *url.Error
	for e := err; errors.As(e, &ue); e = ue.Err {
		msg = strings.ReplaceAll(msg, ue.URL, redactURL(ue.URL))
	}
	return msg
}
