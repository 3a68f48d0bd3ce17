// Command refserver-mcpgo is a reference of make bench-compare and make
// federation-bench, a tool and not part of okso: the simplest MCP server
// written with github.com/mark3labs/mcp-go, one echo tool served over
// Streamable HTTP at /mcp in mcp-go's stateless mode (no session; every
// POST stands alone, answered as application/json). The tool answers
// {"message": M} as structured content and as its JSON text, as the go-sdk
// reference (scripts/refserver) does, so that an answer-checking load
// generator finds M in either. It prints "refserver-mcpgo listening
// http://ADDR/mcp" once it listens and stops on SIGINT or SIGTERM.
//
// It is a module of its own, so that okso's go.mod does not gain mcp-go:
// build it with `go build -C scripts/refserver-mcpgo -o DEST .`.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

type echoOut struct {
	Message string `json:"message"`
}

func echo(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	msg, err := req.RequireString("message")
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	out := echoOut{Message: msg}
	text, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode echo result: %w", err)
	}
	return mcp.NewToolResultStructured(out, string(text)), nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	flag.Parse()

	s := server.NewMCPServer("refserver-mcpgo", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("echo", mcp.WithDescription("Echoes message."),
		mcp.WithString("message", mcp.Required(), mcp.Description("the text to echo"))), echo)
	mux := http.NewServeMux()
	mux.Handle("/mcp", server.NewStreamableHTTPServer(s, server.WithStateLess(true)))

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "refserver-mcpgo:", err)
		os.Exit(1)
	}
	fmt.Printf("refserver-mcpgo listening http://%s/mcp\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "refserver-mcpgo:", err)
		os.Exit(1)
	}
}
