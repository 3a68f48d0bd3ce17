package agent

import (
	"strings"
	"testing"

	"github.com/okso-io/okso/device/wire"
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

// TestAckSlack: ackSlack bounds a cmd_ack's overhead, so a result that
// much under the frame limit fits without resultRoom's encode, whatever
// the cmd's id (a ULID, or one that JSON escapes).
func TestAckSlack(t *testing.T) {
	c := &conn{maxFrame: wire.DefaultMaxFrameBytes}
	for _, id := range []string{"01HZXC0000000000000000SRV0", "", "<&>\u2028\xff\"\\", strings.Repeat("\x01", 40)} {
		if room, bound := c.resultRoom(id), c.maxFrame-ackSlack(id); room < bound {
			t.Errorf("cmd id %q: room %d, less than the bound %d", id, room, bound)
		}
	}
}
