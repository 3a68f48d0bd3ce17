package bus

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/okso-io/okso/internal/ids"
	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
)

// NewRequestID returns a fresh request id ([HeaderRequestID]), a ULID
// ([ids.New]: one allocation; ids of the same millisecond are not
// ordered).
func NewRequestID() string { return ids.New() }

// Call is the body of a request on [NodeCmd]: one tool call for one node.
// The caller's remaining budget travels in [HeaderBudgetMs].
type Call struct {
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
}

// Reply is the body of the answer to a [Call]: either OK with the device's
// result, or an error envelope.
type Reply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *schemas.Error  `json:"error,omitempty"`
}

// ErrorReply encodes a failed [Reply].
func ErrorReply(code, message string) []byte {
	b, _ := json.Marshal(Reply{Error: schemas.NewError(code, message)})
	return b
}

// OKReply encodes a successful [Reply] around an already encoded result.
// An empty result is encoded as null, so the reply is always valid JSON.
func OKReply(result json.RawMessage) []byte {
	if len(result) == 0 {
		result = json.RawMessage("null")
	}
	b := make([]byte, 0, len(result)+24)
	b = append(b, `{"ok":true,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// Encode encodes c as json.Marshal would, by hand when it can.
func (c Call) Encode() ([]byte, error) {
	if !jsonscan.HTMLSafe(c.Tool) || !jsonscan.MarshalsAsIs(c.Arguments) {
		return json.Marshal(c)
	}
	args := c.Arguments
	b := make([]byte, 0, len(c.Tool)+len(args)+26)
	b = append(b, `{"tool":"`...)
	b = append(b, c.Tool...)
	b = append(b, `","arguments":`...)
	b = append(b, args...)
	return append(b, '}'), nil
}

// DecodeCall decodes a [Call] as json.Unmarshal would, in one pass when
// it takes the canonical form. Its Arguments may share b's memory.
func DecodeCall(b []byte) (Call, error) {
	var c Call
	_, ok := jsonscan.Fields(b, []string{"tool", "arguments"}, func(i int, v []byte) (ok bool) {
		if i == 0 {
			c.Tool, ok = jsonscan.String(v)
		} else {
			c.Arguments, ok = jsonscan.Raw(v)
		}
		return ok
	})
	if ok {
		return c, nil
	}
	// Another variable: were c given to json.Unmarshal, it would live on
	// the heap on the one-pass path too.
	var slow Call
	err := json.Unmarshal(b, &slow)
	return slow, err
}

// DecodeReply decodes a [Reply] as json.Unmarshal would, in one pass when
// it is a canonical success. Its Result may share b's memory.
func DecodeReply(b []byte) (Reply, error) {
	var r Reply
	_, ok := jsonscan.Fields(b, []string{"ok", "result"}, func(i int, v []byte) (ok bool) {
		if i == 0 {
			r.OK, ok = jsonscan.Bool(v)
		} else {
			r.Result, ok = jsonscan.Raw(v)
		}
		return ok
	})
	if ok && r.OK {
		return r, nil
	}
	var slow Reply // as in DecodeCall
	err := json.Unmarshal(b, &slow)
	return slow, err
}

// CallDeadline bounds a call that may take d by its caller's remaining
// budget (budgetMs, relative, from the moment it is read) and by its
// deadline (deadlineMs, Unix milliseconds on the caller's clock, which
// may be up to skew away from this host's). It reports false when the
// deadline passed more than skew ago: the call must not start. Headers
// that are absent or malformed bound nothing, as from an older gateway.
func CallDeadline(now time.Time, d time.Duration, budgetMs, deadlineMs string, skew time.Duration) (time.Duration, bool) {
	if b, err := strconv.Atoi(budgetMs); err == nil && b > 0 {
		d = min(d, time.Duration(b)*time.Millisecond)
	}
	if deadlineMs == "" {
		return d, true
	}
	at, err := strconv.ParseInt(deadlineMs, 10, 64)
	if err != nil || at <= 0 {
		return d, true
	}
	left := time.UnixMilli(at).Add(skew).Sub(now)
	if left <= 0 {
		return 0, false
	}
	return min(d, left), true
}
