package logwriter

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedWriter records each write; while gate is open, a write waits for
// it to close, after telling entered.
type gatedWriter struct {
	mu      sync.Mutex
	writes  []string
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	if g.gate != nil {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-g.gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writes = append(g.writes, string(p))
	return len(p), nil
}

// TestLogWriterKeepsEveryLineInOrder: lines from many goroutines all come
// out, whole, each goroutine's in its order.
func TestLogWriterKeepsEveryLineInOrder(t *testing.T) {
	var out gatedWriter
	l := New(&out)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				fmt.Fprintf(l, "g%d %d\n", g, i)
			}
		})
	}
	wg.Wait()
	l.Close()
	next := map[string]int{}
	lines := strings.Split(strings.TrimSuffix(strings.Join(out.writes, ""), "\n"), "\n")
	for _, line := range lines {
		var g string
		var i int
		if _, err := fmt.Sscanf(line, "%s %d", &g, &i); err != nil || next[g] != i {
			t.Fatalf("line %q: want %s %d (%v)", line, g, next[g], err)
		}
		next[g]++
	}
	if len(lines) != 8*500 {
		t.Fatalf("%d lines, want %d", len(lines), 8*500)
	}
}

// TestLogWriterBatches: lines that come while a write is under way go out
// together in the next; after Close, a line is written at once.
func TestLogWriterBatches(t *testing.T) {
	out := &gatedWriter{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	l := New(out)
	fmt.Fprintln(l, "first")
	select {
	case <-out.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first line was not written")
	}
	for i := range 10 {
		fmt.Fprintln(l, "line", i)
	}
	close(out.gate)
	l.Close()
	if len(out.writes) != 2 || out.writes[0] != "first\n" || strings.Count(out.writes[1], "\n") != 10 {
		t.Fatalf("writes %q, want the first line, then the ten others at once", out.writes)
	}
	fmt.Fprintln(l, "after")
	if last := out.writes[len(out.writes)-1]; last != "after\n" {
		t.Fatalf("after Close, last write %q", last)
	}
}

// TestLogWriterBoundsItsBacklog: with the output stalled, the backlog
// stops growing at its bound, and everything is written once the output
// moves again.
func TestLogWriterBoundsItsBacklog(t *testing.T) {
	out := &gatedWriter{entered: make(chan struct{}, 1), gate: make(chan struct{})}
	l := New(out)
	fmt.Fprintln(l, "first")
	<-out.entered
	line := bytes.Repeat([]byte("x"), 1023)
	line = append(line, '\n')
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2 * maxBacklog / len(line) {
			_, _ = l.Write(line)
		}
	}()
	// The writing goroutine fills the backlog to its bound, then waits.
	for {
		l.mu.Lock()
		n := len(l.backlog)
		l.mu.Unlock()
		if n > maxBacklog {
			t.Fatalf("backlog %d bytes, bound %d", n, maxBacklog)
		}
		if n == maxBacklog {
			break
		}
		select {
		case <-done:
			t.Fatal("every write returned while the output was stalled")
		case <-time.After(time.Millisecond):
		}
	}
	close(out.gate)
	<-done
	l.Close()
	total := 0
	for _, w := range out.writes {
		total += len(w)
	}
	if want := len("first\n") + 2*maxBacklog/len(line)*len(line); total != want {
		t.Fatalf("%d bytes written, want %d", total, want)
	}
}

// TestErrorLineSurvivesCrash: an error line logged just before the
// process dies is written, even on one P, where the log writer's own
// goroutine would not get to run first. The crash runs in a child
// process: this test binary again.
func TestErrorLineSurvivesCrash(t *testing.T) {
	const line = "the line that explains the crash"
	if os.Getenv("OKSO_TEST_CRASH") == "1" {
		runtime.GOMAXPROCS(1)
		out := New(os.Stderr)
		log := slog.New(FlushOnError(slog.NewJSONHandler(out, nil), out))
		log.Info("a line before it")
		log.Error(line)
		panic("crash")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestErrorLineSurvivesCrash$")
	cmd.Env = append(os.Environ(), "OKSO_TEST_CRASH=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("panic: crash")) {
		t.Fatalf("the child did not crash: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(line)) || !bytes.Contains(out, []byte("a line before it")) {
		t.Fatalf("lines logged before the crash are missing:\n%s", out)
	}
}
