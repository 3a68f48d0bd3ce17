package wire_test

import (
	"encoding/json"
	"fmt"

	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// One cmd frame, written as the tier writes it and read as the device
// reads it.
func Example() {
	set, err := schemas.Load()
	if err != nil {
		panic(err)
	}
	frame, err := wire.Encode(wire.TypeCmd, "", wire.Cmd{
		Tool:       "sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke",
		Arguments:  json.RawMessage(`{"message":"ping"}`),
		DeadlineMs: 2000,
	})
	if err != nil {
		panic(err)
	}
	e, err := wire.DecodeEnvelope(set, frame)
	if err != nil {
		panic(err)
	}
	var cmd wire.Cmd
	if err := wire.DecodePayload(e, &cmd); err != nil {
		panic(err)
	}
	fmt.Println(e.Type, cmd.Tool, string(cmd.Arguments), cmd.DeadlineMs)
	// Output: cmd sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke {"message":"ping"} 2000
}

// A frame the envelope schema refuses is refused: here, a type key in
// another case, which a case-insensitive decoder would take for the type.
func ExampleDecodeEnvelope() {
	set, err := schemas.Load()
	if err != nil {
		panic(err)
	}
	_, err = wire.DecodeEnvelope(set, []byte(`{"TYPE":"cmd","msg_id":"01HZXC0000000000000000SRV0","payload":{}}`))
	fmt.Println(err != nil)
	// Output: true
}
