// Command fleetbench is the MCP half of scripts/fleet-bench.sh (make
// fleet-bench), a tool and not part of okso: with the official Go SDK
// client it waits until fleet.nodes counts -n online nodes, then times
// fleet.call of system.echo over all of them (checking -n ok rows), and
// the p50 of fleet.nodes for a page of 1,000 and of okso.find_tools over
// every tool. It prints a report and, with -out, key=value lines for the
// script's summary. It exits 1 when a fan-out is not all ok.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/scripts/results"
)

func main() {
	var (
		url         = flag.String("url", "", "gateway MCP endpoint, http://127.0.0.1:PORT/mcp")
		tokenFile   = flag.String("token-file", "", "file holding the agent token")
		n           = flag.Int("n", 0, "expected number of online nodes")
		rounds      = flag.Int("rounds", 3, "fan-outs to time")
		concurrency = flag.Int("concurrency", 64, "fleet.call's concurrency")
		samples     = flag.Int("samples", 30, "calls of fleet.nodes and okso.find_tools to take the p50 of")
		out         = flag.String("out", "", "write key=value results here")
	)
	flag.Parse()
	if *url == "" || *tokenFile == "" || *n < 1 {
		fmt.Fprintln(os.Stderr, "usage: fleetbench -url URL -token-file F -n N")
		os.Exit(2)
	}
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "okso-fleetbench", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: *url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: strings.TrimSpace(string(tok)), Base: http.DefaultTransport}}}, nil)
	if err != nil {
		fatal(err)
	}
	defer s.Close()
	res := map[string]string{}
	ok := true

	// Every node online, as the gateway sees them.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var page struct{ Total int }
		if err := call(ctx, s, "fleet-nodes", map[string]any{"limit": 1}, &page); err != nil {
			fatal(err)
		}
		if page.Total == *n {
			break
		}
		if time.Now().After(deadline) {
			fatal(fmt.Errorf("fleet.nodes counts %d online nodes, want %d", page.Total, *n))
		}
		time.Sleep(500 * time.Millisecond)
	}

	var walls []time.Duration
	for r := range *rounds {
		var run struct {
			Results []struct {
				OK bool `json:"ok"`
			} `json:"results"`
			Summary struct {
				Targeted int            `json:"targeted"`
				OK       int            `json:"ok"`
				Failed   map[string]int `json:"failed"`
			} `json:"summary"`
		}
		t0 := time.Now()
		err := call(ctx, s, "fleet-call", map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "fleet"},
			"max_nodes": *n, "concurrency": *concurrency, "max_total_bytes": 16 << 20}, &run)
		wall := time.Since(t0)
		if err != nil {
			fatal(err)
		}
		okRows := 0
		for _, row := range run.Results {
			if row.OK {
				okRows++
			}
		}
		fmt.Printf("fleet.call round %d: %d nodes in %v (%.0f calls/s), %d ok rows, failed %v\n",
			r+1, run.Summary.Targeted, wall.Round(time.Millisecond), float64(run.Summary.Targeted)/wall.Seconds(), okRows, run.Summary.Failed)
		if okRows != *n || run.Summary.OK != *n {
			ok = false
		}
		walls = append(walls, wall)
	}
	med := median(walls)
	res["fanout_wall"] = med.Round(time.Millisecond).String()
	res["fanout_calls_per_s"] = fmt.Sprintf("%.0f", float64(*n)/med.Seconds())

	res["nodes_page_p50"] = p50(ctx, s, *samples, "fleet-nodes", map[string]any{"limit": 1000}).String()
	res["find_tools_p50"] = p50(ctx, s, *samples, "okso-find_tools", map[string]any{"query": "metrics snapshot"}).String()
	fmt.Printf("fleet.call median %s (%s calls/s); fleet.nodes page of 1000 p50 %s; okso.find_tools p50 %s\n",
		res["fanout_wall"], res["fanout_calls_per_s"], res["nodes_page_p50"], res["find_tools_p50"])
	if *out != "" {
		if err := results.Write(*out, res); err != nil {
			fatal(err)
		}
	}
	if !ok {
		os.Exit(1)
	}
}

// call calls a tool and decodes its structured result.
func call(ctx context.Context, s *mcp.ClientSession, name string, args map[string]any, out any) error {
	r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if r.IsError {
		b, _ := json.Marshal(r.Content)
		return fmt.Errorf("%s: %s", name, b)
	}
	b, _ := json.Marshal(r.StructuredContent)
	return json.Unmarshal(b, out)
}

// p50 is the median time of samples calls of a tool, one at a time.
func p50(ctx context.Context, s *mcp.ClientSession, samples int, name string, args map[string]any) time.Duration {
	var ds []time.Duration
	for range samples {
		var v any
		t0 := time.Now()
		if err := call(ctx, s, name, args, &v); err != nil {
			fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	return median(ds).Round(10 * time.Microsecond)
}

func median(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fleetbench:", err)
	os.Exit(1)
}
