package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// A simulated device's capabilities, and its echo handler at work.
func ExampleMockOptions() {
	set, err := schemas.Load()
	if err != nil {
		panic(err)
	}
	node := "01hzx9k3m4p7q8r9s0t1v2w3xy"
	o := agent.MockOptions(node, set, 1)
	for _, c := range o.Capabilities {
		fmt.Println(c.CapID, c.Kind, c.Verbs)
	}
	res, err := o.Handlers["echo.invoke"](context.Background(), json.RawMessage(`{"message":"ping"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(res.(agent.EchoResult).Message, res.(agent.EchoResult).NodeID == node)
	// Output:
	// echo system.echo [invoke]
	// metrics system.metrics [snapshot subscribe]
	// pin sim.gpio [read write]
	// ping true
}

// A device of okso's own, connected to a device tier until interrupted.
// (Not run here: it needs a tier to dial, and a device token.)
func ExampleNew() {
	set, err := schemas.Load()
	if err != nil {
		log.Fatal(err)
	}
	o := agent.MockOptions(wire.NewNodeID(), set, 1)
	o.URLs, o.Token = []string{"ws://127.0.0.1:8081" + wire.Path}, os.Getenv("OKSO_DEVICE_TOKEN")
	d, err := agent.New(o)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// nil once ctx ends; a *agent.CloseError if a tier refused the device
	// for good.
	if err := d.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
