package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
)

// hostLine is one line host.mjs prints.
type hostLine struct {
	Connected *struct {
		ServerInfo struct {
			Name string `json:"name"`
		} `json:"serverInfo"`
		Capabilities struct {
			Tools *struct {
				ListChanged bool `json:"listChanged"`
			} `json:"tools"`
		} `json:"capabilities"`
		Instructions string `json:"instructions"`
	} `json:"connected"`
	List        *hostList                 `json:"list"`
	Outcome     *outcome                  `json:"outcome"`
	Progress    *struct{ Message string } `json:"progress"`
	Aborted     bool                      `json:"aborted"`
	ListChanged bool                      `json:"listChanged"`
	Closed      bool                      `json:"closed"`
}

type hostList struct {
	Pages []struct {
		Size       int     `json:"size"`
		NextCursor *string `json:"nextCursor"`
	} `json:"pages"`
	Tools []map[string]any `json:"tools"`
}

func (l *hostList) names() []string {
	var names []string
	for _, t := range l.Tools {
		name, _ := t["name"].(string)
		names = append(names, name)
	}
	return names
}

// host is host.mjs connected to one server entry of a host's
// configuration. changes counts the list_changed notifications it has
// printed so far.
type host struct {
	*nodeProc
	changes int
}

// startHost starts host.mjs on the server entry and reads its
// {connected} line.
func startHost(t *testing.T, server any) (*host, *hostLine) {
	t.Helper()
	b, err := json.Marshal(server)
	if err != nil {
		t.Fatal(err)
	}
	h := &host{nodeProc: startScript(t, nil, "host.mjs", string(b))}
	l := h.await(60*time.Second, "connected", func(l *hostLine) bool { return l.Connected != nil })
	return h, l
}

// stdioServer is the entry of a host that starts `okso stdio` for the
// gateway of o, with the token in its environment.
func stdioServer(o *okso, token string) map[string]any {
	return map[string]any{"command": binary, "args": []string{"stdio", "--url", o.mcpURL},
		"env": map[string]string{"OKSO_TOKEN": token, "GORACE": "halt_on_error=1"}}
}

// httpServer is the entry of a host that connects to the gateway itself.
func httpServer(o *okso, token string) map[string]any {
	return map[string]any{"url": o.mcpURL, "headers": map[string]string{"Authorization": "Bearer " + token}}
}

// do asks host.mjs to do op.
func (h *host) do(op map[string]any) {
	h.t.Helper()
	b, _ := json.Marshal(op)
	if _, err := h.stdin.Write(append(b, '\n')); err != nil {
		h.t.Fatalf("host.mjs stdin: %v", err)
	}
}

// await returns the next line that is what, counting the list_changed
// lines that come first; it fails the test on any other line or none
// within timeout.
func (h *host) await(timeout time.Duration, what string, is func(*hostLine) bool) *hostLine {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var l hostLine
		h.next(time.Until(deadline), &l)
		switch {
		case is(&l):
			return &l
		case l.ListChanged:
			h.changes++
		default:
			h.t.Fatalf("host.mjs: want %s, got %s", what, mustJSON(l))
		}
	}
}

func (h *host) list() *hostList {
	h.t.Helper()
	h.do(map[string]any{"op": "list"})
	return h.await(30*time.Second, "{list}", func(l *hostLine) bool { return l.List != nil }).List
}

func (h *host) call(name string, args map[string]any) outcome {
	h.t.Helper()
	h.do(map[string]any{"op": "call", "name": name, "arguments": args})
	return *h.await(30*time.Second, "{outcome}", func(l *hostLine) bool { return l.Outcome != nil }).Outcome
}

// TestStdio drives `okso stdio` as an agent host does, with the official
// TypeScript SDK's stdio client, against a running all-in-one, and
// checks that it serves what the gateway serves over HTTP to the same
// token: the same list, the same results and errors, progress, a cancel
// that reaches the device's stream, and list_changed as devices come and
// go — all over one session of one okso stdio process.
func TestStdio(t *testing.T) {
	o := startOkso(t, 2)
	n0, n1 := o.nodes[0], o.nodes[1]
	// A subject of its own: the cancel's audit event is found by it.
	subject := "stdio-" + strings.ToLower(rand.Text())
	token := o.mintAs(t, subject, auth.ScopeReadOnly)

	h, conn := startHost(t, stdioServer(o, token))
	direct, directConn := startHost(t, httpServer(o, token))
	if conn.Connected.Capabilities.Tools == nil || !conn.Connected.Capabilities.Tools.ListChanged {
		t.Errorf("okso stdio declares %s, want tools.listChanged", mustJSON(conn.Connected.Capabilities))
	}
	if conn.Connected.ServerInfo != directConn.Connected.ServerInfo || conn.Connected.Instructions != directConn.Connected.Instructions {
		t.Errorf("okso stdio introduces itself as %s, the gateway as %s", mustJSON(conn.Connected), mustJSON(directConn.Connected))
	}

	t.Run("list", func(t *testing.T) {
		got, want := h.list(), direct.list()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("okso stdio lists\n%s\nthe gateway lists\n%s", mustJSON(got), mustJSON(want))
		}
		names := readOnlyToolsOf(o.nodes)
		if g := slices.Sorted(slices.Values(got.names())); !slices.Equal(g, names) {
			t.Errorf("okso stdio lists %v, want %v", g, names)
		}
	})

	t.Run("call", func(t *testing.T) {
		var echo struct {
			Message string `json:"message"`
			NodeID  string `json:"node_id"`
		}
		if wantResult(t, "echo", h.call(echoTool(n0), map[string]any{"message": "ping"}), &echo) &&
			(echo.Message != "ping" || echo.NodeID != n0) {
			t.Errorf("echo answered %+v, want ping from %s", echo, n0)
		}
	})

	t.Run("errors as the gateway gives them", func(t *testing.T) {
		for _, c := range []struct {
			what string
			name string
			args map[string]any
		}{
			{"unknown tool", "no_such_tool", nil},
			{"unknown node", echoTool("0000000000000000000000000z"), map[string]any{"message": "ping"}},
			{"undeclared argument", echoTool(n0), map[string]any{"message": "x", "zzz_secret": 1}},
		} {
			got, want := h.call(c.name, c.args), direct.call(c.name, c.args)
			if got.Result != nil && want.Result != nil { // isError results carry each call's own request id
				delete(got.Result.Meta, "io.okso/request_id")
				delete(want.Result.Meta, "io.okso/request_id")
			}
			// The same JSON; not the same bytes: the relay decodes and
			// encodes _meta's objects, whose members Go writes sorted.
			if !jsonEqual([]byte(mustJSON(got)), []byte(mustJSON(want))) {
				t.Errorf("%s: okso stdio answers %s, the gateway %s", c.what, mustJSON(got), mustJSON(want))
			}
		}
		// What the gateway answers, checked once here: a JSON-RPC error
		// for an unknown tool, an isError result for a bad argument.
		if e := h.call("no_such_tool", nil).Error; e == nil || e.Code != -32602 {
			t.Errorf("unknown tool: want the JSON-RPC error -32602, got %s", mustJSON(e))
		} else if env, bad := parseEnvelope(e.Data); bad != "" || env.Code != "E_TOOL_NOT_FOUND" {
			t.Errorf("unknown tool: error data %s, want the E_TOOL_NOT_FOUND envelope %s", e.Data, bad)
		}
		wantError(t, "undeclared argument", h.call(echoTool(n0), map[string]any{"message": "x", "zzz_secret": 1}), "E_MANIFEST_INVALID")
	})

	t.Run("progress, and a cancel that ends the device's stream", func(t *testing.T) {
		// The metric stream is okso's tool that sends progress (its
		// frames); it runs until cancelled.
		h.do(map[string]any{"op": "stream", "name": subscribeTool(n1), "arguments": map[string]any{"interval_ms": 1000}, "frames": 2})
		for i := range 2 {
			l := h.await(30*time.Second, "{progress}", func(l *hostLine) bool { return l.Progress != nil })
			var frame struct {
				NodeID string `json:"node_id"`
				TsMs   int64  `json:"ts_ms"`
			}
			if err := json.Unmarshal([]byte(l.Progress.Message), &frame); err != nil || frame.NodeID != n1 || frame.TsMs == 0 {
				t.Errorf("progress %d: message %q is not a metrics frame of node %s (%v)", i+1, l.Progress.Message, n1, err)
			}
		}
		h.await(10*time.Second, "{aborted}", func(l *hostLine) bool { return l.Aborted })
		// The host keeps its session, and okso stdio its connection to the
		// gateway: only the cancel can end the stream now.
		e, ok := o.audit.wait(streamEnd, func(e bus.AuditEvent) bool {
			return e.Subject == subject && e.Tool == subscribeTool(n1) && e.Decision == bus.DecisionStreamClosed
		})
		if !ok {
			t.Errorf("the stream of a call the host cancelled did not end within %s", streamEnd)
		} else {
			t.Logf("cancelled stream closed with %s after %s", e.Code, e.Duration)
		}
		if oc := h.await(10*time.Second, "{outcome}", func(l *hostLine) bool { return l.Outcome != nil }); oc.Outcome.Error == nil {
			t.Errorf("the aborted call resolved with %s; want the client to throw", mustJSON(oc.Outcome))
		}
	})

	t.Run("list_changed as devices come and go", func(t *testing.T) {
		fleet := startFleet(t, o, 1)
		var newNode string
		h.untilChanged(t, "a device came", func(names []string) bool {
			for _, name := range names {
				if n, ok := echoNode(name); ok && !slices.Contains(o.nodes, n) {
					newNode = n
				}
			}
			return newNode != ""
		})
		fleet.stop(t)
		h.untilChanged(t, "the device left", func(names []string) bool { return !slices.Contains(names, listedName(echoTool(newNode))) })
	})

	h.finish()
	direct.finish()
}

// untilChanged waits for list_changed notifications, listing after each,
// until the list is as done wants (a notification already on its way may
// be about an earlier change). Only a list_changed makes it list again.
func (h *host) untilChanged(t *testing.T, what string, done func(names []string) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		h.await(time.Until(deadline), "{listChanged} once "+what, func(l *hostLine) bool { return l.ListChanged })
		if done(h.list().names()) {
			return
		}
	}
	t.Fatalf("no list_changed within 60 s after which the list shows that %s", what)
}

// TestStdioPages lists through okso stdio a fleet too large for one page
// of tools/list: the host follows the gateway's own cursors, page by
// page, and gets what it gets from the gateway itself.
func TestStdioPages(t *testing.T) {
	const mock = 260 // 4 tools each for a read-only token: 1,040, more than a page
	o := startOkso(t, mock)
	h, _ := startHost(t, stdioServer(o, o.token))
	direct, _ := startHost(t, httpServer(o, o.token))
	got, want := h.list(), direct.list()
	if len(want.Pages) < 2 {
		t.Fatalf("the gateway lists %d tools in %d page(s); the test needs more than one", len(want.Tools), len(want.Pages))
	}
	if !reflect.DeepEqual(got.Pages, want.Pages) {
		t.Errorf("okso stdio gives the pages (size, nextCursor) %s, the gateway %s", mustJSON(got.Pages), mustJSON(want.Pages))
	}
	if !reflect.DeepEqual(got.Tools, want.Tools) {
		t.Errorf("okso stdio lists %d tools, the gateway %d, or not the same", len(got.Tools), len(want.Tools))
	}
	h.finish()
	direct.finish()
}

// TestStdioInspector runs the MCP Inspector's CLI in its stdio mode with
// `okso stdio` as the server command, as a user tries a command-launched
// server: --cli <command> <args> -e OKSO_TOKEN=... --method ...
func TestStdioInspector(t *testing.T) {
	o := startOkso(t, 1)
	node := o.nodes[0]
	inspector := func(t *testing.T, method ...string) (stdout string) {
		t.Helper()
		args := append([]string{"--cli", "-e", "OKSO_TOKEN=" + o.token}, method...)
		args = append(args, "--", binary, "stdio", "--url", o.mcpURL)
		out, errOut, err := runNode(t, nil, "inspector", args...)
		if err != nil {
			t.Fatalf("inspector %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(method, " "), err, out, errOut)
		}
		return string(out)
	}

	t.Run("tools/list", func(t *testing.T) {
		t.Parallel()
		out := inspector(t, "--method", "tools/list")
		var l listed
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("stdout is not the list (%v):\n%s", err, out)
		}
		want := slices.Sorted(slices.Values(append(readOnlyTools(node), oksoTools()...)))
		if got := slices.Sorted(slices.Values(l.names())); !slices.Equal(got, want) {
			t.Errorf("the Inspector lists %v through okso stdio, want %v", got, want)
		}
	})

	t.Run("tools/call", func(t *testing.T) {
		t.Parallel()
		out := inspector(t, "--method", "tools/call", "--tool-name", listedName(echoTool(node)), "--tool-arg", "message=ping")
		var r callResult
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("stdout is not the result (%v):\n%s", err, out)
		}
		var echo struct {
			Message string `json:"message"`
			NodeID  string `json:"node_id"`
		}
		if wantResult(t, "echo", outcome{Result: &r}, &echo) && (echo.Message != "ping" || echo.NodeID != node) {
			t.Errorf("echo answered %+v, want ping from %s", echo, node)
		}
	})
}

// TestStdioRefused checks what a host's user sees when okso stdio cannot
// serve: exit status 1 at once, before any MCP message, and one line on
// stderr that says why.
func TestStdioRefused(t *testing.T) {
	o := startOkso(t, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/mcp"
	ln.Close()
	for _, c := range []struct {
		what, url, token, want string
	}{
		{"a token the gateway refuses", o.mcpURL, "not-a-token", "refused the token: 401 Unauthorized"},
		{"nothing listening", closed, o.token, "cannot reach the gateway " + closed},
		{"no token", o.mcpURL, "", "--token (or OKSO_TOKEN)"},
		{"not a URL", "127.0.0.1:8080", o.token, `--url "127.0.0.1:8080"`},
	} {
		t.Run(c.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, "stdio", "--url", c.url)
			cmd.Env = []string{"OKSO_TOKEN=" + c.token, "HOME=" + t.TempDir()}
			// The host's pipe stays open: okso stdio must end by itself.
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			defer stdin.Close()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err = cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("okso stdio exited with %v, want status 1\nstderr:\n%s", err, &stderr)
			}
			if stdout.Len() > 0 {
				t.Errorf("okso stdio wrote %q on stdout, the host's protocol stream", &stdout)
			}
			last := lastLine(stderr.String())
			if !strings.HasPrefix(last, "okso: ") || !strings.Contains(last, c.want) {
				t.Errorf("the last line on stderr is %q, want one saying %q", last, c.want)
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// fleet is an `okso mock-fleet` process connected to the device tier of
// an all-in-one.
type fleet struct {
	cmd    *exec.Cmd
	exited chan error
	log    *tailBuffer
}

// startFleet starts n simulated devices of their own (a seed of their
// own: node ids of their own) on o's device tier, with more flags of
// okso mock-fleet.
func startFleet(t *testing.T, o *okso, n int, extra ...string) *fleet {
	t.Helper()
	f := &fleet{exited: make(chan error, 1), log: &tailBuffer{}}
	f.cmd = exec.Command(binary, append([]string{"mock-fleet", "-n", fmt.Sprint(n), "--connect", o.deviceURL,
		"--data-dir", o.dataDir, "--seed", "424242", "--tenant", tenant}, extra...)...)
	f.cmd.Stderr = f.log
	if err := f.cmd.Start(); err != nil {
		t.Fatalf("start okso mock-fleet: %v", err)
	}
	go func() { f.exited <- f.cmd.Wait() }()
	t.Cleanup(func() { f.stop(t) })
	return f
}

// stop ends the fleet with SIGTERM, as an operator does, and waits for it.
func (f *fleet) stop(t *testing.T) {
	t.Helper()
	if f.exited == nil {
		return
	}
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-f.exited:
		if err != nil {
			t.Errorf("okso mock-fleet exited with %v on SIGTERM; its log ends:\n%s", err, f.log)
		}
	case <-time.After(20 * time.Second):
		_ = f.cmd.Process.Kill()
		<-f.exited
		t.Errorf("okso mock-fleet did not stop within 20 s of SIGTERM")
	}
	f.exited = nil
}
