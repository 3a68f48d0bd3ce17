package roles

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/okso-io/okso/bench"
)

func benchCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		o      bench.Options
		args   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load an MCP endpoint (okso's or any other) with tools/call, tools/list or metric streams and report rate and latency",
		Long: "okso bench opens --sessions MCP client sessions (official Go SDK, Streamable HTTP) to --url\n" +
			"and keeps --concurrency requests in flight over them for --warmup, not counted, then for\n" +
			"--duration. --tool is an exact tool name, or a pattern in which * stands for any run of\n" +
			"characters and a . or - for either (okso lists safe names, sysecho-<node>-echo-invoke, or seed\n" +
			"names), which spreads the calls round-robin over every listed tool it matches (e.g.\n" +
			"'sysecho.*' calls every node's echo, 'sys.*.metrics.subscribe' every node's metric stream).\n" +
			"--mode list times full tools/list listings instead, following every page.\n\n" +
			"--mode subscribe holds --concurrency streams open on okso's streaming door (POST\n" +
			"/mcp/tools/call on --url's host, Accept: text/event-stream; --args default {\"interval_ms\":1000})\n" +
			"for the warm-up and the duration, then closes them (--sessions does not apply: one session\n" +
			"lists the tools of a pattern). It reports the streams held open to the end, those refused\n" +
			"or closed early by code (http/<status>, close/<code>), the metric frames per second in all\n" +
			"and per stream in the measured time, and the time from request to first frame.\n\n" +
			"--mode raw drives a stateless server as wrk would: --concurrency keep-alive HTTP/1.1\n" +
			"connections, each POSTing one JSON-RPC tools/call after another to --url (no session;\n" +
			"Mcp-Protocol-Version --protocol, default " + bench.RawProtocol + "), but each call's message is unique\n" +
			"(--args' message, default bench, then -<n>) and an answer counts as ok only when it is that\n" +
			"request's result and echoes the message; one that does not is the error no-echo.\n\n" +
			"A progress line goes to stderr every second. At the end: calls/s, errors by code (an isError\n" +
			"result's envelope code, JSON-RPC error codes, transport failures), latency\n" +
			"percentiles of the successful calls and a histogram; with --json one JSON object on stdout.",
		Example: "  okso bench --token \"$TOKEN\" --tool 'sysecho.*'\n" +
			"  okso bench --url http://127.0.0.1:9000/mcp --tool echo --concurrency 1 --sessions 1\n" +
			"  okso bench --token \"$TOKEN\" --mode list --concurrency 4 --sessions 1\n" +
			"  okso bench --token \"$TOKEN\" --mode raw --tool 'sysecho.*' --concurrency 64\n" +
			"  okso bench --token \"$TOKEN\" --mode subscribe --tool 'sys.*.metrics.subscribe' --concurrency 1000 --duration 30s",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Mode != bench.ModeList && o.Tool == "" {
				return fmt.Errorf("--tool is required in %s mode: a tool name, or a pattern with * (e.g. 'sysecho.*')", o.Mode)
			}
			if o.Duration <= 0 {
				return fmt.Errorf("--duration %v: want a positive duration", o.Duration)
			}
			if o.Warmup == 0 {
				o.Warmup = -1 // bench.Options: zero means the default
			}
			o.Args = json.RawMessage(args)
			o.Progress = stderr
			res, err := bench.Run(contextOf(cmd), o)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				err = enc.Encode(res)
			} else {
				err = res.WriteText(stdout)
			}
			if err != nil {
				return err
			}
			if res.OK == 0 {
				if o.Mode == bench.ModeSubscribe {
					return fmt.Errorf("no stream of %d held open to the end", res.Ops)
				}
				return fmt.Errorf("no %s request succeeded in %d", o.Mode, res.Ops)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.URL, "url", bench.DefaultURL, "MCP endpoint")
	fs.StringVar(&o.Token, "token", "", "bearer token (e.g. the agent token all-in-one prints)")
	fs.IntVar(&o.Sessions, "sessions", bench.DefaultSessions, "MCP client sessions (at most --concurrency)")
	fs.IntVar(&o.Concurrency, "concurrency", bench.DefaultConcurrency, "requests in flight in total, spread over the sessions (subscribe: streams held open)")
	fs.DurationVar(&o.Duration, "duration", bench.DefaultDuration, "measured time")
	fs.DurationVar(&o.Warmup, "warmup", bench.DefaultWarmup, "time run first and not counted")
	fs.Uint64Var(&o.Calls, "calls", 0, "run exactly this many calls (or listings), each counted, however long they take; --duration and --warmup are then unused (0: run for --duration)")
	fs.StringVar(&o.Tool, "tool", "", "tool to call: an exact name, or a pattern where * is any run of characters (every matching tool, round-robin)")
	fs.StringVar(&args, "args", "", "arguments of each call, a JSON object (default "+bench.DefaultArgs+"; subscribe: "+bench.DefaultSubscribeArgs+")")
	fs.StringVar(&o.Mode, "mode", bench.ModeCall, "call (tools/call), list (a full tools/list, every page, per operation), subscribe (streams held open) or raw (tools/call as bare HTTP POSTs, answers checked)")
	fs.BoolVar(&asJSON, "json", false, "print the result as JSON on stdout")
	fs.StringVar(&o.Protocol, "protocol", "", "MCP protocol version to request (default: the SDK's latest)")
	fs.IntVar(&o.MaxTools, "max-tools", 0, "use only the first N tools --tool matches (0: all)")
	return cmd
}
