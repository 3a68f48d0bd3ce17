package bench_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/bench"
)

func ExampleRun() {
	// A server to load: one echo tool, at the SDK's defaults.
	type msg struct {
		Message string `json:"message"`
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "example", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in msg) (*mcp.CallToolResult, msg, error) {
		return nil, in, nil
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	defer hs.Close()

	r, err := bench.Run(context.Background(), bench.Options{
		URL:         hs.URL,
		Tool:        "echo",
		Sessions:    1,
		Concurrency: 4,
		Duration:    200 * time.Millisecond,
		Warmup:      -1, // none
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("tools:", r.Tools, "calls ok:", r.OK > 0, "errors:", len(r.Errors))
	// r.WriteText(os.Stdout) prints the rate, errors, percentiles and histogram.
	// Output: tools: 1 calls ok: true errors: 0
}
