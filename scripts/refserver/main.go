// Command refserver is the reference of make bench-compare, a tool and not
// part of okso: the simplest MCP server written directly with the official
// Go SDK, one typed echo tool served over Streamable HTTP at /mcp with the
// SDK's defaults. It prints "refserver listening http://ADDR/mcp" once it
// listens and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type echoIn struct {
	Message string `json:"message" jsonschema:"the text to echo"`
}

type echoOut struct {
	Message string `json:"message" jsonschema:"the text received"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	stateless := flag.Bool("stateless", false, "serve without sessions (the SDK's default is stateful)")
	jsonResp := flag.Bool("json-response", false, "answer with application/json instead of an SSE stream")
	flag.Parse()

	s := mcp.NewServer(&mcp.Implementation{Name: "refserver", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echoes message."},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, echoOut, error) {
			return nil, echoOut(in), nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: *stateless, JSONResponse: *jsonResp})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "refserver:", err)
		os.Exit(1)
	}
	fmt.Printf("refserver listening http://%s/mcp\n", ln.Addr())
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
		fmt.Fprintln(os.Stderr, "refserver:", err)
		os.Exit(1)
	}
}
