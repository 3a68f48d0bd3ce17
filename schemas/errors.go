package schemas

import "encoding/json"

// Error codes: the closed set of DESIGN.md §5, on every surface.
const (
	CodeBadRequest       = "E_BAD_REQUEST"
	CodeManifestInvalid  = "E_MANIFEST_INVALID"
	CodeToolNotFound     = "E_TOOL_NOT_FOUND"
	CodeSafetyDenied     = "E_SAFETY_DENIED"
	CodeNodeOffline      = "E_NODE_OFFLINE"
	CodeDeadlineExceeded = "E_DEADLINE_EXCEEDED"
	CodeRateLimited      = "E_RATE_LIMITED"
	CodeInternal         = "E_INTERNAL"
)

// Category returns the category of a code, and "fatal" for a code outside
// the closed set.
func Category(code string) string {
	switch code {
	case CodeBadRequest:
		return "usage"
	case CodeManifestInvalid:
		return "invalid_arguments"
	case CodeToolNotFound:
		return "tool_not_found"
	case CodeSafetyDenied:
		return "unauthorized"
	case CodeNodeOffline, CodeRateLimited:
		return "provider_failure"
	case CodeDeadlineExceeded:
		return "timeout"
	}
	return "fatal"
}

// KnownCode reports whether code is in the closed set.
func KnownCode(code string) bool { return code == CodeInternal || Category(code) != "fatal" }

// Error is the error envelope {code, category, message}. Message is always
// written by okso, in ASCII; it never carries device- or caller-supplied text.
type Error struct {
	Code     string `json:"code"`
	Category string `json:"category"`
	Message  string `json:"message"`
}

// NewError builds an envelope; a code outside the closed set becomes
// E_INTERNAL.
func NewError(code, message string) *Error {
	if !KnownCode(code) {
		code = CodeInternal
	}
	return &Error{Code: code, Category: Category(code), Message: message}
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// JSON returns the envelope encoded as JSON.
func (e *Error) JSON() []byte {
	b, _ := json.Marshal(e)
	return b
}
