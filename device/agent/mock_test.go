package agent

import (
	"encoding/json"
	"testing"
)

// FuzzEchoMessage: a message echoMessage reads is the one json.Unmarshal
// decodes from the same arguments.
func FuzzEchoMessage(f *testing.F) {
	for _, s := range []string{`{"message":"ping"}`, `{"message":""}`, `{"Message":"x"}`, `{"message":"a\"b"}`,
		`{"message":"x","message":"y"}`, `{"message":1}`, `{"message":"\u00e9"}`, `{}`, ` {"message" : "p" } `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, args []byte) {
		msg, ok := echoMessage(args)
		if !ok {
			return
		}
		var in struct {
			Message string `json:"message"`
		}
		if err := json.Unmarshal(args, &in); err != nil || in.Message != msg {
			t.Fatalf("echoMessage(%q) = %q; json.Unmarshal: %q, %v", args, msg, in.Message, err)
		}
	})
}
