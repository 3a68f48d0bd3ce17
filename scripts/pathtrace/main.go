// Command pathtrace splits the latency of okso's calls at one call in
// flight into the segments of their path, from Go execution traces of
// `okso all-in-one` and of the `okso mock-fleet` that answers them
// (scripts/latency-path.sh takes both, from --debug-addr). A tool, not part
// of okso.
//
// Calls are sequential at one in flight, so each process's trace is read as
// a sequence of marks, each a goroutine state change found by its stack:
//
//	all-in-one                               mock-fleet
//	the request is readable (HTTP conn woken)
//	the gateway waits for NATS (request sent)
//	the tier's cmd write begins (syscall)    the cmd is readable
//	                                         the cmd_ack write begins
//	the cmd_ack is readable
//	the gateway has the reply
//	the HTTP response write begins
//
// It prints the quartiles of each segment between two marks, in
// microseconds, and of the writes' syscalls. Only calls that find each
// process idle (woken by the network) are counted, the usual case at one
// in flight. Times are the tracer's, so each includes its (small)
// overhead.
//
// Usage: pathtrace ALLINONE.trace [FLEET.trace]
package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/exp/trace"
)

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: pathtrace ALLINONE.trace [FLEET.trace]")
		os.Exit(2)
	}
	paths := []*path{allInOne, mockFleet}
	for i, file := range os.Args[1:] {
		if err := paths[i].read(file); err != nil {
			fmt.Fprintln(os.Stderr, "pathtrace:", err)
			os.Exit(1)
		}
		paths[i].print(os.Stdout)
	}
}

// A path is the sequence of marks one call passes in one process, and
// the syscalls whose durations are reported beside it.
type path struct {
	title    string
	marks    []mark
	syscalls []syscall
	// durations[i] are the times from mark i to mark i+1, in µs;
	// durations[len(marks)-1] the times from the first mark to the last.
	durations [][]float64
}

// A mark is one point of a call's path: the transition of a goroutine
// that identifies it. A mark with on >= 0 only matches the goroutine that
// reached mark number on.
type mark struct {
	name  string
	on    int
	match func(t transition) bool
}

// A syscall is timed from its entry, matched by the stack it is entered
// from, to its return. It is not a mark: the kernel may run the peer it
// wakes before it returns, and the call's path may go on meanwhile on
// another thread, so its return comes in no fixed order.
type syscall struct {
	name  string
	from  string
	times []float64
}

// A transition is one goroutine state change, with the stack it was taken
// at and the stack the goroutine last waited at.
type transition struct {
	from, to  trace.GoState
	stack     string
	waitStack string
}

// woken: a goroutine that waited in a function of waitingIn (and none of
// not) becomes runnable.
func woken(waitingIn string, not ...string) func(transition) bool {
	return func(t transition) bool {
		if t.from != trace.GoWaiting || t.to != trace.GoRunnable || !strings.Contains(t.waitStack, waitingIn) {
			return false
		}
		for _, n := range not {
			if strings.Contains(t.waitStack, n) {
				return false
			}
		}
		return true
	}
}

// syscallIn: a goroutine enters a syscall from a function of in.
func syscallIn(in string) func(transition) bool {
	return func(t transition) bool {
		return t.from == trace.GoRunning && t.to == trace.GoSyscall && strings.Contains(t.stack, in)
	}
}

// The marks are named after the segment that ends at them.
var allInOne = &path{
	title: "all-in-one",
	marks: []mark{
		{"request readable", -1, woken("net/http.(*connReader).Read", "backgroundRead")},
		{"gateway: checks, NATS request sent", 0, func(t transition) bool {
			return t.to == trace.GoWaiting && strings.Contains(t.stack, "requestWithContext")
		}},
		{"NATS to the tier, cmd built", -1, syscallIn("device.(*session).writeRaw")},
		{"cmd write, the device's round trip", -1, woken("device.(*session).read")},
		{"tier: ack read, NATS to the gateway", 0, func(t transition) bool { return t.to == trace.GoRunnable }},
		{"gateway: result checks, response built", 0, syscallIn("net.(*conn).Write")},
	},
	syscalls: []syscall{
		{name: "tier: cmd write", from: "device.(*session).writeRaw"},
		{name: "gateway: response write", from: "net/http.(*response).finishRequest"},
	},
}

var mockFleet = &path{
	title: "mock-fleet",
	marks: []mark{
		{"cmd readable", -1, woken("device.(*conn).recv")},
		{"device: cmd read, handled, ack built", -1, syscallIn("device.(*conn).send")},
	},
	syscalls: []syscall{{name: "device: cmd_ack write", from: "device.(*conn).send"}},
}

// read finds every whole call in a trace.
func (p *path) read(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	p.durations = make([][]float64, len(p.marks))
	waits := map[trace.GoID]string{}
	type entry struct {
		at trace.Time
		sc *syscall
	}
	inSyscall := map[trace.GoID]entry{}
	at := make([]trace.Time, len(p.marks))
	gs := make([]trace.GoID, len(p.marks))
	next := 0
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		g := st.Resource.Goroutine()
		t := transition{stack: stackOf(st.Stack), waitStack: waits[g]}
		t.from, t.to = st.Goroutine()
		if t.to == trace.GoWaiting && t.stack != "" { // not the tracer's stackless status of a waiting goroutine
			waits[g] = t.stack
		}
		if t.from == trace.GoSyscall {
			if e, ok := inSyscall[g]; ok {
				e.sc.times = append(e.sc.times, float64(ev.Time()-e.at)/1e3)
				delete(inSyscall, g)
			}
		}
		if t.to == trace.GoSyscall {
			for i := range p.syscalls {
				if strings.Contains(t.stack, p.syscalls[i].from) {
					inSyscall[g] = entry{ev.Time(), &p.syscalls[i]}
				}
			}
		}
		if next > 0 && p.marks[0].match(t) {
			next = 0 // the call was lost track of; a new one begins
		}
		m := p.marks[next]
		if (m.on >= 0 && g != gs[m.on]) || !m.match(t) {
			continue
		}
		at[next], gs[next] = ev.Time(), g
		next++
		if next == len(p.marks) {
			for i := 1; i < len(at); i++ {
				p.durations[i-1] = append(p.durations[i-1], float64(at[i]-at[i-1])/1e3)
			}
			p.durations[len(at)-1] = append(p.durations[len(at)-1], float64(at[len(at)-1]-at[0])/1e3)
			next = 0
		}
	}
	if len(p.durations[0]) == 0 {
		return fmt.Errorf("%s: no whole call found (a trace of calls at one in flight?)", file)
	}
	return nil
}

func stackOf(st trace.Stack) string {
	var b strings.Builder
	for f := range st.Frames() {
		b.WriteString(f.Func)
		b.WriteByte('<')
	}
	return b.String()
}

func (p *path) print(w io.Writer) {
	fmt.Fprintf(w, "%s, %d calls: µs from %q (p25, median, p75)\n", p.title, len(p.durations[0]), p.marks[0].name)
	for i, d := range p.durations {
		switch {
		case i+1 < len(p.marks):
			row(w, p.marks[i+1].name, d)
		case len(p.marks) > 2:
			row(w, "total", d)
		}
	}
	for _, sc := range p.syscalls {
		if len(sc.times) > 0 {
			row(w, sc.name+" (syscall, within the above)", sc.times)
		}
	}
}

func row(w io.Writer, name string, d []float64) {
	slices.Sort(d)
	q := func(f float64) float64 { return d[int(f*float64(len(d)-1))] }
	fmt.Fprintf(w, "  %-52s %7.1f %7.1f %7.1f\n", name, q(0.25), q(0.5), q(0.75))
}
