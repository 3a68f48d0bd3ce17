package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/schemas"
)

// describer is the action client's describe_tool.
type describer interface {
	Describe(ctx context.Context, tool string) (remote.Tool, error)
}

// TestMCPEchoScript: scripts/mcp_echo.sh through the action client, once
// as it is (with jq when the machine has it) and once with a PATH that
// has no jq, as on a CI image without it.
func TestMCPEchoScript(t *testing.T) {
	script, err := filepath.Abs("../scripts/mcp_echo.sh")
	if err != nil {
		t.Fatal(err)
	}
	noJQ := t.TempDir()
	for _, tool := range []string{"awk", "cat"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("mcp_echo.sh needs %s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(noJQ, tool)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = exec.LookPath("jq")
	t.Logf("jq on this machine: %v", err == nil)

	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"as is", nil},
		{"without jq", map[string]string{"PATH": noJQ}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := remote.NewAction(remote.ActionOptions{Command: []string{script}, Env: tc.env, Log: testLog(t)})
			defer c.Close()
			tools, err := c.List(bounded(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(tools) != 1 || tools[0].Name != "echo_external" {
				t.Fatalf("List = %+v, want echo_external alone", tools)
			}
			tl := tools[0]
			var in, out struct {
				Type       string
				Properties map[string]struct{ Type string }
				Required   []string
			}
			if err := json.Unmarshal(tl.InputSchema, &in); err != nil || in.Type != "object" ||
				in.Properties["message"].Type != "string" || !reflect.DeepEqual(in.Required, []string{"message"}) {
				t.Errorf("input schema %s", tl.InputSchema)
			}
			if err := json.Unmarshal(tl.OutputSchema, &out); err != nil || out.Properties["echo"].Type != "string" {
				t.Errorf("output schema (from result_schema) %s", tl.OutputSchema)
			}
			if !strings.HasPrefix(tl.Description, "Echoes a message back.") || !strings.HasSuffix(tl.Description, "Safety: read-only: no side effects, nothing kept") {
				t.Errorf("description %q: want the description, then the safety text", tl.Description)
			}
			d, err := c.(describer).Describe(bounded(t), "echo_external")
			if err != nil || !reflect.DeepEqual(d, tl) {
				t.Errorf("Describe = %+v, %v; want what List said, %+v", d, err, tl)
			}
			_, err = c.(describer).Describe(bounded(t), "nope")
			wantCode(t, err, schemas.CodeInternal, false)

			const msg = "hi \"there\" \\ é \u2028 \n\t end"
			args, _ := json.Marshal(map[string]string{"message": msg})
			raw, err := c.Call(bounded(t), "echo_external", args, meta)
			if err != nil {
				t.Fatal(err)
			}
			r := decodeResult(t, raw)
			var echo struct{ Echo string }
			if err := json.Unmarshal(r.StructuredContent, &echo); err != nil || echo.Echo != msg || r.IsError {
				t.Errorf("call = %s, want the message echoed", raw)
			}
			if len(r.Content) != 1 || r.Content[0].Type != "text" || !jsonEqual(r.Content[0].Text, string(r.StructuredContent)) {
				t.Errorf("call = %s: want one text content, the result's JSON", raw)
			}

			// The endpoint's own errors are the tool's answers.
			for _, call := range []struct{ tool, args string }{
				{"nope", `{"message":"x"}`},
				{"echo_external", `{"message":5}`},
				{"echo_external", `{}`},
			} {
				raw, err := c.Call(bounded(t), call.tool, json.RawMessage(call.args), nil)
				if err != nil {
					t.Fatalf("call %s %s: %v", call.tool, call.args, err)
				}
				r := decodeResult(t, raw)
				var e struct{ Name, Category, Message string }
				if !r.IsError || r.StructuredContent != nil || len(r.Content) != 1 ||
					json.Unmarshal([]byte(r.Content[0].Text), &e) != nil || e.Name != "mcp_echo" || e.Category != "usage" || e.Message == "" {
					t.Errorf("call %s %s = %s, want isError with the error object as text", call.tool, call.args, raw)
				}
			}
		})
	}
}

func jsonEqual(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// writeScript writes an endpoint script and returns its path.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "endpoint.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestActionBadReplies: every reply that is not exactly one JSON object of
// the protocol, from a process that exits 0 in time, is E_INTERNAL; a
// process past the timeout is E_DEADLINE_EXCEEDED, within the timeout.
func TestActionBadReplies(t *testing.T) {
	const timeout = 400 * time.Millisecond
	tools := `{"type":"result","tools":[]}`
	for _, tc := range []struct {
		name, script string
		call         bool // call_tool rather than list_tools
		code, why    string
	}{
		{"not JSON", `echo hello`, false, schemas.CodeInternal, "not JSON"},
		{"nothing", `true`, false, schemas.CodeInternal, "not JSON"},
		{"two objects", `echo '` + tools + tools + `'`, false, schemas.CodeInternal, "more after the object"},
		{"two lines", `echo '` + tools + `'; echo '` + tools + `'`, false, schemas.CodeInternal, "more after the object"},
		{"trailing garbage", `echo '` + tools + ` x'`, false, schemas.CodeInternal, "more after the object"},
		{"an array", `echo '[]'`, false, schemas.CodeInternal, "not an object"},
		{"no tools", `echo '{"type":"result"}'`, false, schemas.CodeInternal, "no tools"},
		{"an error for list_tools", `echo '{"type":"error","error":{"name":"x","category":"usage","message":"no"}}'`, false, schemas.CodeInternal, "answered with an error"},
		{"non-zero exit", `echo '` + tools + `'; exit 1`, false, schemas.CodeInternal, "exit status 1"},
		{"killed", `echo '` + tools + `'; kill -9 $$`, false, schemas.CodeInternal, "killed"},
		{"longer than 4 MiB", `head -c 5000000 /dev/zero | tr '\0' ' '; echo '` + tools + `'`, false, schemas.CodeInternal, "longer than"},
		{"too slow", `sleep 600`, false, schemas.CodeDeadlineExceeded, "no reply within"},
		{"replies, then does not exit", `echo '` + tools + `'; exec >&-; sleep 600`, false, schemas.CodeDeadlineExceeded, "did not exit within"},
		{"a result that is not an object", `echo '{"type":"result","tool":"t","result":5}'`, true, schemas.CodeInternal, "neither"},
		{"an error that is not an object", `echo '{"type":"error","error":"no"}'`, true, schemas.CodeInternal, "neither"},
		{"neither", `echo '{"type":"other"}'`, true, schemas.CodeInternal, "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := remote.NewAction(remote.ActionOptions{Command: []string{writeScript(t, tc.script)}, Timeout: timeout, Log: testLog(t)})
			defer c.Close()
			start := time.Now()
			var err error
			if tc.call {
				_, err = c.Call(bounded(t), "t", nil, nil)
			} else {
				_, err = c.List(bounded(t))
			}
			if took := time.Since(start); took > timeout+time.Second {
				t.Errorf("took %v, timeout %v", took, timeout)
			}
			wantCode(t, err, tc.code, false)
			if err != nil && !strings.Contains(err.Error(), tc.why) {
				t.Errorf("error %q does not say %q", err, tc.why)
			}
		})
	}
}

// TestActionGoodReplies: what a well-behaved endpoint may do. A child it
// leaves behind, holding stdout, does not hold the reply back.
func TestActionGoodReplies(t *testing.T) {
	for _, tc := range []struct{ name, script string }{
		{"pretty-printed", `printf '\n  {\n "type": "result",\n "tools": []\n}\n\n'`},
		{"a child left behind", `echo '{"type":"result","tools":[]}'; sleep 600 &`},
		{"stdin unread", `echo '{"type":"result","tools":[]}'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := remote.NewAction(remote.ActionOptions{Command: []string{writeScript(t, tc.script)}, Log: testLog(t)})
			defer c.Close()
			start := time.Now()
			tools, err := c.List(bounded(t))
			if err != nil || len(tools) != 0 {
				t.Errorf("List = %v, %v", tools, err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}

// TestActionRequest: what the endpoint gets on stdin (the call with its
// _meta) and in its environment (its own, PATH and HOME, nothing of
// ours); arguments that are not an object never start it.
func TestActionRequest(t *testing.T) {
	t.Setenv("OKSO_TEST_SECRET", "leaked")
	dir := t.TempDir()
	script := writeScript(t, `cat > "$OUT/stdin"; env > "$OUT/env"; echo '{"type":"result","tool":"t","result":{"ok":true}}'`)
	c := remote.NewAction(remote.ActionOptions{Command: []string{script}, Env: map[string]string{"OUT": dir}, Log: testLog(t)})
	defer c.Close()

	for _, args := range []string{`[1]`, `"x"`, `null`, `1`, `{"a":`, `{} {}`} {
		_, err := c.Call(bounded(t), "t", json.RawMessage(args), meta)
		if !errors.Is(err, remote.ErrNotObject) {
			t.Errorf("arguments %s: %v, want ErrNotObject", args, err)
		}
		wantCode(t, err, schemas.CodeManifestInvalid, false)
	}
	if _, err := os.Stat(filepath.Join(dir, "stdin")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the endpoint ran for arguments that are not an object (%v)", err)
	}

	raw, err := c.Call(bounded(t), "t", json.RawMessage(`{"a":[1,2]}`), meta)
	if err != nil {
		t.Fatal(err)
	}
	if r := decodeResult(t, raw); !jsonEqual(string(r.StructuredContent), `{"ok":true}`) {
		t.Errorf("call = %s", raw)
	}
	b, err := os.ReadFile(filepath.Join(dir, "stdin"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"action":"call_tool","tool":"t","arguments":{"a":[1,2]},"_meta":{"io.okso/request_id":"01JREQUEST","traceparent":"` + meta["traceparent"].(string) + `"}}`
	if !jsonEqual(string(b), want) {
		t.Errorf("stdin = %s, want %s", b, want)
	}
	env, err := os.ReadFile(filepath.Join(dir, "env"))
	if err != nil {
		t.Fatal(err)
	}
	if !containsLine(string(env), "OUT="+dir) || !containsLine(string(env), "PATH="+os.Getenv("PATH")) {
		t.Errorf("env lacks OUT or PATH:\n%s", env)
	}
	if strings.Contains(string(env), "OKSO_TEST_SECRET") {
		t.Errorf("env has the tier's OKSO_TEST_SECRET:\n%s", env)
	}
}

// TestActionClose: Close ends a request under way, and later ones are
// refused.
func TestActionClose(t *testing.T) {
	dir := t.TempDir()
	c := remote.NewAction(remote.ActionOptions{
		Command: []string{writeScript(t, `touch "$OUT/started"; sleep 600`)},
		Env:     map[string]string{"OUT": dir}, Log: testLog(t),
	})
	failed := make(chan error, 1)
	go func() {
		_, err := c.List(bounded(t))
		failed <- err
	}()
	eventually(t, "the request started", func() bool {
		_, err := os.Stat(filepath.Join(dir, "started"))
		return err == nil
	})
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case err := <-failed:
		wantCode(t, err, schemas.CodeNodeOffline, false)
	case <-time.After(waitLong):
		t.Fatal("the request under way did not end")
	}
	_, err := c.List(bounded(t))
	wantCode(t, err, schemas.CodeNodeOffline, false)
	if c.Changed() != nil || c.Done() != nil {
		t.Errorf("Changed, Done = %v, %v; want nil channels", c.Changed(), c.Done())
	}
}

// TestActionUnreadStdin: a process that leaves its stdin unread, held by
// a process of its own outside its group, does not keep a large request's
// write, and so the call, past the timeout.
func TestActionUnreadStdin(t *testing.T) {
	const timeout = 400 * time.Millisecond
	script := writeScript(t, `setsid sleep 3 <&0 >/dev/null 2>&1 & exec sleep 600`)
	c := remote.NewAction(remote.ActionOptions{Command: []string{script}, Timeout: timeout, Log: testLog(t)})
	defer c.Close()
	args := json.RawMessage(`{"x":"` + strings.Repeat("a", 512<<10) + `"}`) // far more than a pipe holds
	start := time.Now()
	_, err := c.Call(bounded(t), "t", args, nil)
	if took := time.Since(start); took > timeout+time.Second {
		t.Errorf("took %v, timeout %v", took, timeout)
	}
	wantCode(t, err, schemas.CodeDeadlineExceeded, false)
}
