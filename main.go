// Command okso lets AI agents operate a fleet of edge devices through the
// Model Context Protocol. See README.md, and `okso --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/okso-io/okso/roles"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := roles.NewRoot(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "okso:", err)
		os.Exit(1)
	}
}
