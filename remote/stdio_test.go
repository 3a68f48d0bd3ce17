package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
	"github.com/okso-io/okso/schemas"
)

var meta = map[string]any{
	"io.okso/request_id": "01JREQUEST",
	"traceparent":        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}

// TestStdioListAndCall: every page of the list, a call whose _meta reaches
// the upstream, and the result without the upstream's _meta.
func TestStdioListAndCall(t *testing.T) {
	c, state := dialStdio(t, testupstream.Options{PageSize: 2})
	tools, err := c.List(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	names := toolNames(tools)
	slices.Sort(names)
	if want := []string{"add_tool", "count", "echo", "flaky", "hang", "reset"}; !slices.Equal(names, want) {
		t.Fatalf("List = %v, want %v (6 tools in pages of 2)", names, want)
	}
	for _, tl := range tools {
		if tl.Name == "echo" && !json.Valid(tl.InputSchema) {
			t.Errorf("echo's input schema %q", tl.InputSchema)
		}
	}

	raw, err := c.Call(bounded(t), "echo", json.RawMessage(`{"message":"hi"}`), meta)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeResult(t, raw)
	var e echoed
	if err := json.Unmarshal(r.StructuredContent, &e); err != nil {
		t.Fatal(err)
	}
	if r.IsError || len(r.Content) != 1 || r.Content[0].Text != "hi" || e.Message != "hi" {
		t.Errorf("echo = %s", raw)
	}
	for k, v := range meta {
		if e.Meta[k] != v {
			t.Errorf("_meta %s reached the upstream as %v, want %v", k, e.Meta[k], v)
		}
	}
	if n := testupstream.Calls(state, "echo"); n != 1 {
		t.Errorf("echo called %d times, want 1", n)
	}

	// Arguments left out are {}; count counts.
	for want := 1; want <= 2; want++ {
		raw, err := c.Call(bounded(t), "count", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var n struct{ Count int }
		if err := json.Unmarshal(decodeResult(t, raw).StructuredContent, &n); err != nil || n.Count != want {
			t.Errorf("count = %s, want %d", raw, want)
		}
	}
}

// TestStdioRefusals: unknown tool, arguments that are not an object (never
// sent), and a hanging tool past the deadline, after which the session
// still answers.
func TestStdioRefusals(t *testing.T) {
	c, state := dialStdio(t, testupstream.Options{})
	_, err := c.Call(bounded(t), "nope", nil, nil)
	wantCode(t, err, schemas.CodeToolNotFound, false)

	for _, args := range []string{`[1]`, `"x"`, `null`, `{"message":`} {
		_, err := c.Call(bounded(t), "echo", json.RawMessage(args), nil)
		if !errors.Is(err, remote.ErrNotObject) {
			t.Errorf("arguments %s: %v, want ErrNotObject", args, err)
		}
		wantCode(t, err, schemas.CodeManifestInvalid, false)
	}
	if n := testupstream.Calls(state, "echo"); n != 0 {
		t.Errorf("echo called %d times with arguments that are not an object", n)
	}

	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	_, err = c.Call(ctx, "hang", nil, meta)
	if took := time.Since(start); took > deadline+time.Second {
		t.Errorf("hang returned after %v, deadline %v", took, deadline)
	}
	wantCode(t, err, schemas.CodeDeadlineExceeded, false)
	if _, err := c.Call(bounded(t), "echo", json.RawMessage(`{"message":"still here"}`), nil); err != nil {
		t.Errorf("after a call past its deadline: %v", err)
	}
}

// TestStdioListChanged: the upstream's notifications/tools/list_changed
// comes out of Changed, and the next List has the new tool.
func TestStdioListChanged(t *testing.T) {
	c, _ := dialStdio(t, testupstream.Options{})
	if _, err := c.List(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(bounded(t), "add_tool", json.RawMessage(`{"name":"extra"}`), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Changed():
	case <-time.After(waitLong):
		t.Fatal("no list_changed")
	}
	tools, err := c.List(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(toolNames(tools), "extra") {
		t.Errorf("List after list_changed = %v, want extra in it", toolNames(tools))
	}
}

// TestStdioKilled: a child killed under a call fails that call, and every
// later one, at once with a transient E_NODE_OFFLINE, and Done is closed.
func TestStdioKilled(t *testing.T) {
	c, state := dialStdio(t, testupstream.Options{})
	pid, err := testupstream.PID(state)
	if err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	go func() {
		_, err := c.Call(bounded(t), "hang", nil, nil)
		failed <- err
	}()
	eventually(t, "hang called", func() bool { return testupstream.Calls(state, "hang") == 1 })
	if p, err := os.FindProcess(pid); err != nil || p.Kill() != nil {
		t.Fatalf("kill the upstream: %v", err)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, remote.ErrProcessExited) {
			t.Errorf("call in flight: %v, want ErrProcessExited", err)
		}
		wantCode(t, err, schemas.CodeNodeOffline, true)
	case <-time.After(waitLong):
		t.Fatal("the call in flight did not fail")
	}
	waitClosed(t, c.Done(), "Done after the child was killed")
	_, err = c.Call(bounded(t), "echo", json.RawMessage(`{"message":"x"}`), nil)
	if !errors.Is(err, remote.ErrProcessExited) {
		t.Errorf("call after: %v, want ErrProcessExited", err)
	}
	wantCode(t, err, schemas.CodeNodeOffline, true)
	_, err = c.List(bounded(t))
	wantCode(t, err, schemas.CodeNodeOffline, true)
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestStdioFlakyExit: a child that dies in a call fails it transiently;
// dialled again (the tier's restart), it answers, and the count shows
// both attempts.
func TestStdioFlakyExit(t *testing.T) {
	state := t.TempDir()
	c, _ := dialStdio(t, testupstream.Options{State: state, Flaky: 1})
	_, err := c.Call(bounded(t), "flaky", nil, nil)
	wantCode(t, err, schemas.CodeNodeOffline, true)
	waitClosed(t, c.Done(), "Done after the child exited")

	c, _ = dialStdio(t, testupstream.Options{State: state, Flaky: 1})
	raw, err := c.Call(bounded(t), "flaky", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var a struct{ Attempt int }
	if err := json.Unmarshal(decodeResult(t, raw).StructuredContent, &a); err != nil || a.Attempt != 2 {
		t.Errorf("flaky = %s, want attempt 2", raw)
	}
	if n := testupstream.Calls(state, "flaky"); n != 2 {
		t.Errorf("flaky called %d times, want 2", n)
	}
}

// TestDialStdioFails: a command that cannot start, and one that exits
// before it speaks MCP (transient: the tier starts it again later).
func TestDialStdioFails(t *testing.T) {
	_, err := remote.DialStdio(bounded(t), remote.StdioOptions{Command: []string{"/nonexistent/upstream"}})
	wantCode(t, err, schemas.CodeInternal, false)
	_, err = remote.DialStdio(bounded(t), remote.StdioOptions{Command: []string{"sh", "-c", "echo bye >&2; exit 3"}, Log: testLog(t)})
	if !errors.Is(err, remote.ErrProcessExited) {
		t.Errorf("DialStdio of a command that exits: %v, want ErrProcessExited", err)
	}
	wantCode(t, err, schemas.CodeNodeOffline, true)
	_, err = remote.DialStdio(bounded(t), remote.StdioOptions{})
	wantCode(t, err, schemas.CodeInternal, false)
}

// TestStdioEnv: the child's environment is its configuration's, PATH and
// HOME, nothing else of ours.
func TestStdioEnv(t *testing.T) {
	t.Setenv("OKSO_TEST_SECRET", "leaked")
	dir := t.TempDir()
	// The child writes its environment, then serves as the test upstream.
	argv, env := testupstream.Command(testupstream.Options{State: dir})
	env["OKSO_TEST_GIVEN"] = "given"
	c, err := remote.DialStdio(bounded(t), remote.StdioOptions{
		Command: []string{"sh", "-c", `env > "$OKSO_TESTUPSTREAM_STATE/env" && exec "$0"`, argv[0]},
		Env:     env, Log: testLog(t), Dir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := os.ReadFile(dir + "/env")
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{"OKSO_TEST_GIVEN=given", "PATH=" + os.Getenv("PATH"), "PWD=" + dir} {
		if !containsLine(got, want) {
			t.Errorf("child env lacks %s:\n%s", want, got)
		}
	}
	if containsLine(got, "OKSO_TEST_SECRET=leaked") {
		t.Errorf("child env has the tier's OKSO_TEST_SECRET:\n%s", got)
	}
}

func containsLine(s, line string) bool {
	return slices.Contains(splitLines(s), line)
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}

// TestCloseDuringCall: Close does not wait for a call under way, which
// fails as a closed connection would (not transient: the tier is going).
func TestCloseDuringCall(t *testing.T) {
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			var (
				c       remote.Client
				calls   func() int
				release = func() {}
			)
			if transport == "stdio" {
				var state string
				c, state = dialStdio(t, testupstream.Options{})
				calls = func() int { return testupstream.Calls(state, "hang") }
			} else {
				u, srv := serveHTTP(t, testupstream.Options{})
				c, calls, release = dialHTTP(t, srv.URL, nil), func() int { return u.Calls("hang") }, u.Release
			}
			failed := make(chan error, 1)
			go func() {
				_, err := c.Call(bounded(t), "hang", nil, nil)
				failed <- err
			}()
			eventually(t, "hang called", func() bool { return calls() == 1 })
			start := time.Now()
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			select {
			case err := <-failed:
				wantCode(t, err, schemas.CodeNodeOffline, false)
			case <-time.After(waitLong):
				t.Fatal("the call under way did not end")
			}
			release()
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close: %v", err)
				}
			case <-time.After(waitLong):
				t.Fatal("Close did not return")
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Close took %v with a call under way", took)
			}
			waitClosed(t, c.Done(), "Done after Close")
		})
	}
}
