package bus

import "encoding/json"

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
	Error  *Error          `json:"error,omitempty"`
}

// ErrorReply encodes a failed [Reply].
func ErrorReply(code, message string) []byte {
	b, _ := json.Marshal(Reply{Error: NewError(code, message)})
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
