package roles

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/device/wire"
)

// startAgent runs `okso agent` with args in this process; failing it
// returns its start error at once, else nil and the agent runs until
// the test ends.
func startAgent(t *testing.T, stderr *logSink, args ...string) (stop func() error) {
	t.Helper()
	return runRoot(t, newLogSink(), stderr, append([]string{"agent"}, args...)...)
}

// TestSecondAgentOnADataDir runs all-in-one, whose own agent serves the
// data dir's node, then okso agent on the same data dir: it refuses to
// start, in one line naming the data dir, the node, the process serving
// it and --replace. With --replace it takes the node over: all-in-one's
// agent says so once, at warn, and stops serving the node (the new agent
// gets the data dir's lock only once the old one's device has stopped,
// so it cannot come back), and the node answers through the new agent.
func TestSecondAgentOnADataDir(t *testing.T) {
	dataDir := t.TempDir()
	out, aioLog := newLogSink(), newLogSink()
	runRoot(t, out, aioLog, "all-in-one", "--data-dir", dataDir, "--mcp-addr", "127.0.0.1:0",
		"--device-addr", "127.0.0.1:0", "--mock", "0")
	deviceURL := bannerRow(t, out, "device tier")
	node := strings.Fields(bannerRow(t, out, "this host"))[1]
	aioLog.wait(t, "all-in-one's agent connected", line("agent connected", "node_id", node))

	root := NewRoot(newLogSink(), newLogSink())
	root.SetArgs([]string{"agent", "--data-dir", dataDir, "--connect", deviceURL})
	err := root.Execute()
	want := fmt.Sprintf("data dir %s: its node %s is already served by a running process (pid %d); --replace takes it over",
		dataDir, node, os.Getpid())
	if err == nil || err.Error() != want {
		t.Fatalf("a second agent on the data dir: %v, want %q", err, want)
	}

	agentLog := newLogSink()
	startAgent(t, agentLog, "--data-dir", dataDir, "--connect", deviceURL, "--replace")
	aioLog.wait(t, "all-in-one's agent gives the node up", line("node taken over: this agent stops serving it",
		"role", "agent", "level", "WARN", "data_dir", dataDir))
	agentLog.wait(t, "the new agent holds the node", line("node taken over: the other process let it go", "node_id", node))
	if n := aioLog.count(line("node taken over: this agent stops serving it")); n != 1 {
		t.Errorf("all-in-one said %d times that its node was taken over, want once", n)
	}
	if n := agentLog.count(line("node taken over: this agent stops serving it")); n != 0 {
		t.Errorf("the new agent gave its node up:\n%s", agentLog)
	}

	s := mcpSession(t, bannerRow(t, out, "MCP endpoint"), bannerRow(t, out, "agent token"))
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoName(node), Arguments: map[string]any{"message": "hi"}})
	if err != nil || res.IsError {
		t.Fatalf("echo on the node taken over: %v %+v", err, res)
	}
}

// TestReplaceAnAgentThatCannotReachItsTier: an agent whose tier is
// unreachable gets no 4409 when another takes its node over; it sees the
// data dir's node marked as the other's after its next failed attempt,
// says so, and ends, so that it never takes the node back.
func TestReplaceAnAgentThatCannotReachItsTier(t *testing.T) {
	dataDir := t.TempDir()
	out, aioLog := newLogSink(), newLogSink()
	runRoot(t, out, aioLog, "all-in-one", "--data-dir", dataDir, "--mcp-addr", "127.0.0.1:0",
		"--device-addr", "127.0.0.1:0", "--mock", "0", "--local-agent=false")
	deviceURL := bannerRow(t, out, "device tier")

	oldLog := newLogSink()
	stopOld := startAgent(t, oldLog, "--data-dir", dataDir, "--connect", "ws://"+closedAddr(t)+wire.Path)
	oldLog.wait(t, "the old agent cannot reach its tier", line("device tier unreachable"))

	newLog := newLogSink()
	startAgent(t, newLog, "--data-dir", dataDir, "--connect", deviceURL, "--replace")
	newLog.wait(t, "the new agent connected", line("agent connected"))
	gaveUp := oldLog.wait(t, "the old agent gives the node up", line("node taken over: this agent stops serving it"))
	if r, _ := gaveUp["reason"].(string); !strings.Contains(r, fmt.Sprintf("process %d took it over", os.Getpid())) {
		t.Errorf("the old agent's line %v does not say which process took the node", gaveUp)
	}
	newLog.wait(t, "the new agent holds the node", line("node taken over: the other process let it go"))
	if err := stopOld(); err != nil {
		t.Errorf("the replaced agent: %v", err)
	}
}

// TestAllInOneReplacesAnAgent runs okso agent on a data dir, connected to
// a tier of another NATS, then all-in-one on that data dir: refused
// without --replace, with it all-in-one's own agent takes the node over.
// No 4409 reaches the old agent (its tier is another NATS's); it sees the
// mark in the data dir, says so, and its okso agent ends on its own.
func TestAllInOneReplacesAnAgent(t *testing.T) {
	dataDir := t.TempDir()
	tierLog := newLogSink()
	runRoot(t, newLogSink(), tierLog, "device", "--data-dir", dataDir, "--device-addr", "127.0.0.1:0")
	deviceURL, _ := tierLog.wait(t, "the tier listening", line("listening"))["device_url"].(string)

	agentLog := newLogSink()
	root := NewRoot(newLogSink(), agentLog)
	root.SetArgs([]string{"agent", "--data-dir", dataDir, "--connect", deviceURL})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ended := make(chan error, 1)
	go func() { ended <- root.ExecuteContext(ctx) }()
	connected := agentLog.wait(t, "the agent connected", line("agent connected"))
	node, _ := connected["node_id"].(string)

	allInOne := []string{"all-in-one", "--data-dir", dataDir, "--mcp-addr", "127.0.0.1:0",
		"--device-addr", "127.0.0.1:0", "--mock", "0"}
	refused := NewRoot(newLogSink(), newLogSink())
	refused.SetArgs(allInOne)
	if err := refused.Execute(); err == nil || !strings.Contains(err.Error(),
		fmt.Sprintf("its node %s is already served by a running process (pid %d); --replace takes it over", node, os.Getpid())) {
		t.Fatalf("all-in-one on the agent's data dir: %v, want a refusal naming the node and --replace", err)
	}

	aioLog := newLogSink()
	runRoot(t, newLogSink(), aioLog, append(allInOne, "--replace")...)
	aioLog.wait(t, "all-in-one's agent connected", line("agent connected", "node_id", node))
	agentLog.wait(t, "the old agent gives the node up", line("node taken over: this agent stops serving it", "level", "WARN"))
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("the replaced okso agent ended with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the replaced okso agent did not end")
	}
	aioLog.wait(t, "all-in-one holds the node", line("node taken over: the other process let it go", "node_id", node))
}
