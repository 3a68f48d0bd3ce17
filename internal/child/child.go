// Package child runs a command as the leader of a process group of its
// own, over pipes whose ends are ours, and ends the whole group: the
// remote tier's stdio and action upstreams and the device agent's local
// tools. A process that stops or dies takes nothing of its group with it
// unnoticed, and, where okso is the reaper of orphans (BecomeSubreaper),
// not even what escaped the group.
package child

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// A process is given these bounds.
const (
	// stopGrace is how long Close waits for a stdio process to exit once
	// its stdin is closed, and again after SIGTERM, before SIGKILL.
	stopGrace = 2 * time.Second
	// drainWait is how long output is still read once the process group
	// is gone: what is left in the pipes comes at once, so only a process
	// that escaped the group (setsid) can make it wait that long.
	drainWait = time.Second
	// stderrLine is the longest stderr line logged; the rest is cut.
	stderrLine = 1024
	// stderrRate and stderrBurst bound the stderr lines logged per
	// process; the others are counted and the count logged.
	stderrRate  = 20
	stderrBurst = 100
)

// A Proc is one process, the leader of a process group of its own,
// talking over pipes whose ends are ours: so that Wait returns as soon as
// the process exits, whoever else holds the pipes, and so that its owner
// can then end the whole group, reap it, and read the pipes to their end.
// Start it with [Start].
type Proc struct {
	cmd    *exec.Cmd
	Stdin  *os.File // our end of the process's stdin; the caller closes it
	Stdout *os.File // our end of the process's stdout; the caller closes it
	// exited is closed once the process has exited and every process
	// of its group has been killed and reaped (the reaping of those
	// that are not our children is their parent's).
	exited chan struct{}
	// done is closed after exited, once the process's stderr has been
	// read to its end.
	done chan struct{}
	err  error // how the process ended (Wait's error); set before exited is closed
	// pipes are the inodes of its stdin, stdout and stderr pipes, by
	// which an orphan it left is known (endEscaped).
	pipes []uint64
}

// Options say how a process is started and where its stderr goes.
type Options struct {
	Argv []string
	// Env is the process's whole environment besides our PATH and HOME
	// (which it may set too).
	Env map[string]string
	Dir string
	// Log receives the process's stderr, a line per record, with
	// LogMessage (default "stderr") at LogLevel.
	Log        *slog.Logger
	LogMessage string
	LogLevel   slog.Level
}

// Start starts o.Argv in o.Dir with o.Env and nothing else of ours but
// PATH and HOME.
func Start(o Options) (*Proc, error) {
	argv, env, dir, log := o.Argv, o.Env, o.Dir, o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("no command")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ(env)
	cmd.Dir = dir
	setGroup(cmd)
	var pipes [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	for i := 0; i < len(pipes); i += 2 {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range pipes[:i] {
				f.Close()
			}
			return nil, fmt.Errorf("start %s: %w", argv[0], err)
		}
		pipes[i], pipes[i+1] = r, w
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0], pipes[3], pipes[5]
	p := &Proc{cmd: cmd, Stdin: pipes[1], Stdout: pipes[2], exited: make(chan struct{}), done: make(chan struct{})}
	for _, f := range []*os.File{pipes[1], pipes[2], pipes[4]} {
		if ino := pipeInode(f); ino != 0 {
			p.pipes = append(p.pipes, ino)
		}
	}
	started := make(chan error, 1)
	go p.run(started, pipes[4], stderrLog{log, cmp.Or(o.LogMessage, "stderr"), o.LogLevel})
	if err := <-started; err != nil {
		p.Stdin.Close()
		p.Stdout.Close()
		pipes[4].Close()
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	return p, nil
}

// environ is a child's whole environment: our PATH and HOME, then env.
func environ(env map[string]string) []string {
	out := make([]string, 0, len(env)+2)
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			if _, mine := env[k]; !mine {
				out = append(out, k+"="+v)
			}
		}
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// run starts the process, reports the outcome on started, and then
// waits for it, ends its group, and reads its stderr to the end.
func (p *Proc) run(started chan<- error, stderr *os.File, log stderrLog) {
	unlock := lockThread()
	err := startTracked(p.cmd)
	// The child's ends are the child's now.
	p.cmd.Stdin.(*os.File).Close()
	p.cmd.Stdout.(*os.File).Close()
	p.cmd.Stderr.(*os.File).Close()
	if err != nil {
		unlock()
		started <- err
		return
	}
	started <- nil
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		logStderr(stderr, log)
	}()
	p.err = p.cmd.Wait()
	untrack(p.cmd.Process.Pid)
	unlock()
	endGroup(p.cmd.Process.Pid)
	endEscaped(p.pipes)
	// Nothing of the group is left to write: what the pipes hold comes at
	// once, then EOF, unless a process that left the group holds them
	// and okso is not its reaper (endEscaped ended it otherwise).
	deadline := time.Now().Add(drainWait)
	_ = p.Stdout.SetReadDeadline(deadline)
	_ = stderr.SetReadDeadline(deadline)
	close(p.exited)
	<-logged
	close(p.done)
}

// Exited is closed once the process has exited and every process of its
// group has been killed and reaped (the reaping of those that are not
// our children is their parent's).
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Done is closed after Exited, once the process's stderr has been read to
// its end.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended (exec.Cmd.Wait's error), once Exited is
// closed.
func (p *Proc) Err() error { return p.err }

// ExitCode is the process's exit status once Exited is closed, or -1 when
// a signal ended it.
func (p *Proc) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Stop ends the process politely, as the MCP specification asks of a
// stdio client whose stdin is already closed: a grace period, SIGTERM to
// the group, another, then SIGKILL. It returns once p is done.
func (p *Proc) Stop() {
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		signalGroup(p.cmd, syscall.SIGTERM)
		t.Reset(stopGrace)
		select {
		case <-p.exited:
		case <-t.C:
			signalGroup(p.cmd, syscall.SIGKILL)
		}
	}
	<-p.done
}

// Kill ends the process and its group at once, and returns once p is
// done.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
	default:
		signalGroup(p.cmd, syscall.SIGKILL)
	}
	<-p.done
}

// logStderr logs what a process writes on stderr, line by line, each cut
// to stderrLine bytes, at most stderrRate lines a second; it returns at
// EOF or once r's read deadline passes, and closes r.
func logStderr(r *os.File, log stderrLog) {
	defer r.Close()
	lim := rate.NewLimiter(stderrRate, stderrBurst)
	br := bufio.NewReaderSize(r, stderrLine)
	dropped := 0
	for {
		line, err := readLine(br)
		if line != "" {
			if lim.Allow() {
				if dropped > 0 {
					log.line(line, "dropped_before", dropped)
				} else {
					log.line(line)
				}
				dropped = 0
			} else {
				dropped++
			}
		}
		if err != nil {
			if dropped > 0 {
				log.Log(context.Background(), log.level, log.msg+" lines dropped", "dropped", dropped)
			}
			return
		}
	}
}

// stderrLog is where a process's stderr lines go.
type stderrLog struct {
	*slog.Logger
	msg   string
	level slog.Level
}

func (l stderrLog) line(line string, args ...any) {
	l.Log(context.Background(), l.level, l.msg, append([]any{"line", line}, args...)...)
}

// readLine reads one line from br, and returns at most its first
// stderrLine bytes, as valid UTF-8 without the line end.
func readLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadSlice('\n')
	s := strings.TrimRight(strings.ToValidUTF8(string(line), "\uFFFD"), "\r\n")
	for errors.Is(err, bufio.ErrBufferFull) { // the rest of a long line
		_, err = br.ReadSlice('\n')
	}
	return s, err
}
