package agent

import (
	"testing"

	"github.com/okso-io/okso/internal/jsonscan/jsonscantest"
)

// FuzzEchoMessage: a message echoMessage reads is the one encoding/json
// decodes, strictly, from the same arguments.
func FuzzEchoMessage(f *testing.F) {
	for _, s := range []string{`{"message":"ping"}`, `{"message":""}`, `{"Message":"x"}`, `{"message":"a\"b"}`,
		`{"message":"x","message":"y"}`, `{"message":1}`, `{"message":"\u00e9"}`, `{}`, ` {"message" : "p" } `} {
		f.Add([]byte(s))
	}
	type echoArgs struct {
		Message string `json:"message"`
	}
	f.Fuzz(func(t *testing.T, args []byte) {
		if msg, ok := echoMessage(args); ok {
			jsonscantest.Agrees(t, args, echoArgs{msg})
		}
	})
}
