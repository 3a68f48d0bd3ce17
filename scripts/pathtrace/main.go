// Command pathtrace splits the latency of okso's calls at one call in
// flight into the segments of their path, from Go execution traces of
// `okso all-in-one` and of the `okso mock-fleet` that answers them, taken
// over the same seconds (scripts/latency-path.sh takes both, from
// --debug-addr). A tool, not part of okso.
//
// Go stamps trace events with the machine's monotonic clock, so the two
// traces merge into one timeline. Calls are sequential at one in flight,
// so the timeline is read as a sequence of marks, each a goroutine state
// change found by its process and its stack:
//
//	all-in-one                                 mock-fleet
//	the request is readable (HTTP conn woken)
//	the gateway waits for NATS (request sent)
//	the tier's cmd write begins (syscall)
//	                                           the cmd is readable
//	                                           the cmd_ack write begins
//	the cmd_ack is readable
//	the gateway has the reply
//	the HTTP response write begins
//
// It prints the quartiles of each segment between two marks, and of the
// writes' syscalls, in microseconds. Only calls that find each process
// idle (woken by the network) are counted: the usual case at one in
// flight. Times are the tracer's, so each includes its (small) overhead.
//
// Usage: pathtrace ALLINONE.trace [FLEET.trace]
//
// With the all-in-one trace alone it prints the segments inside it (the
// device's round trip then counts from the cmd write to the cmd_ack).
package main

import (
	"cmp"
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
	var all []transition
	for i, file := range os.Args[1:] {
		ts, err := read(file, process(i))
		if err != nil {
			fmt.Fprintln(os.Stderr, "pathtrace:", err)
			os.Exit(1)
		}
		all = append(all, ts...)
	}
	slices.SortStableFunc(all, func(a, b transition) int { return cmp.Compare(a.at, b.at) })
	marks := gatewayMarks
	if len(os.Args) == 3 {
		marks = slices.Insert(slices.Clone(gatewayMarks), 3, fleetMarks...)
		marks[5].name = "cmd_ack write, to the tier"
	}
	p := follow(all, marks)
	if len(p.total) == 0 {
		fmt.Fprintln(os.Stderr, "pathtrace: no whole call found (traces of calls at one in flight, over the same seconds?)")
		os.Exit(1)
	}
	p.print(os.Stdout, marks)
}

type process int

const (
	allInOne process = iota
	mockFleet
)

func (p process) String() string { return [...]string{"all-in-one", "mock-fleet"}[p] }

// A transition is one goroutine state change: when, in which process,
// the stack it was taken at and the stack the goroutine last waited at.
type transition struct {
	at        trace.Time
	proc      process
	g         trace.GoID
	from, to  trace.GoState
	stack     string
	waitStack string
}

// read returns the goroutine state changes of one trace.
func read(file string, proc process) ([]transition, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []transition
	waits := map[trace.GoID]string{}
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		t := transition{at: ev.Time(), proc: proc, g: st.Resource.Goroutine(), stack: stackOf(st.Stack)}
		t.from, t.to = st.Goroutine()
		t.waitStack = waits[t.g]
		// The tracer notes a waiting goroutine's status without a stack
		// at times: that is no new wait.
		if t.to == trace.GoWaiting && t.stack != "" {
			waits[t.g] = t.stack
		}
		out = append(out, t)
	}
}

func stackOf(st trace.Stack) string {
	var b strings.Builder
	for f := range st.Frames() {
		b.WriteString(f.Func)
		b.WriteByte('<')
	}
	return b.String()
}

// A mark is one point of a call's path, named after the segment that ends
// at it. A mark with on >= 0 only matches the goroutine that reached mark
// number on (counted in the marks of its own process).
type mark struct {
	name  string
	proc  process
	on    int
	match func(t transition) bool
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

var gatewayMarks = []mark{
	{"request readable", allInOne, -1, woken("net/http.(*connReader).Read", "backgroundRead")},
	{"gateway: checks, NATS request sent", allInOne, 0, func(t transition) bool {
		return t.to == trace.GoWaiting && strings.Contains(t.stack, "requestWithContext")
	}},
	{"NATS to the tier, cmd built", allInOne, -1, syscallIn("tier.(*session).writeRaw")},
	// the fleet's marks go here, when its trace is given
	{"cmd write, the device's round trip", allInOne, -1, woken("tier.(*session).read")},
	{"tier: ack read, NATS to the gateway", allInOne, 0, func(t transition) bool { return t.to == trace.GoRunnable }},
	{"gateway: result checks, response built", allInOne, 0, syscallIn("net.(*conn).Write")},
}

var fleetMarks = []mark{
	{"cmd write, to the device", mockFleet, -1, woken("agent.(*conn).recv")},
	{"device: cmd read, handled, ack built", mockFleet, -1, syscallIn("agent.(*conn).send")},
}

// A syscall is timed from its entry, found by the function it is entered
// from, to its return. It is no mark: the kernel may run the peer it wakes
// before it returns, and the path may go on meanwhile on another thread,
// so its return comes in no fixed order.
var syscalls = []struct {
	name string
	proc process
	from string
}{
	{"tier: cmd write (syscall)", allInOne, "tier.(*session).writeRaw"},
	{"device: cmd_ack write (syscall)", mockFleet, "agent.(*conn).send"},
	{"gateway: response write (syscall)", allInOne, "net/http.(*response).finishRequest"},
}

// durations are the figures of the calls followed, in µs.
type durations struct {
	segments [][]float64 // segments[i]: from mark i to mark i+1
	total    []float64   // from the first mark to the last
	syscalls [][]float64
}

// follow walks the timeline and times every whole call.
func follow(all []transition, marks []mark) durations {
	d := durations{segments: make([][]float64, len(marks)-1), syscalls: make([][]float64, len(syscalls))}
	type key struct {
		proc process
		g    trace.GoID
	}
	type entry struct {
		at trace.Time
		i  int
	}
	inSyscall := map[key]entry{}
	at := make([]trace.Time, len(marks))
	gs := make([]trace.GoID, len(marks))
	// index[i] is mark i's number among the marks of its process.
	index, perProc := make([]int, len(marks)), map[process]int{}
	byIndex := map[process][]int{}
	for i, m := range marks {
		index[i] = perProc[m.proc]
		perProc[m.proc]++
		byIndex[m.proc] = append(byIndex[m.proc], i)
	}
	next := 0
	for _, t := range all {
		k := key{t.proc, t.g}
		if e, ok := inSyscall[k]; ok && t.from == trace.GoSyscall {
			d.syscalls[e.i] = append(d.syscalls[e.i], µs(t.at-e.at))
			delete(inSyscall, k)
		}
		if t.to == trace.GoSyscall {
			for i, sc := range syscalls {
				if sc.proc == t.proc && strings.Contains(t.stack, sc.from) {
					inSyscall[k] = entry{t.at, i}
				}
			}
		}
		if next > 0 && t.proc == marks[0].proc && marks[0].match(t) {
			next = 0 // the call was lost track of; a new one begins
		}
		m := marks[next]
		if t.proc != m.proc || (m.on >= 0 && t.g != gs[byIndex[m.proc][m.on]]) || !m.match(t) {
			continue
		}
		at[next], gs[next] = t.at, t.g
		next++
		if next == len(marks) {
			for i := range d.segments {
				d.segments[i] = append(d.segments[i], µs(at[i+1]-at[i]))
			}
			d.total = append(d.total, µs(at[len(at)-1]-at[0]))
			next = 0
		}
	}
	return d
}

func µs(t trace.Time) float64 { return float64(t) / 1e3 }

func (d durations) print(w io.Writer, marks []mark) {
	fmt.Fprintf(w, "%d calls: µs from %q in %s (p25, median, p75)\n", len(d.total), marks[0].name, marks[0].proc)
	for i, s := range d.segments {
		row(w, fmt.Sprintf("%-12s %s", marks[i+1].proc, marks[i+1].name), s)
	}
	row(w, "total", d.total)
	for i, sc := range syscalls {
		if len(d.syscalls[i]) > 0 {
			row(w, fmt.Sprintf("%-12s %s", sc.proc, sc.name), d.syscalls[i])
		}
	}
}

func row(w io.Writer, name string, d []float64) {
	slices.Sort(d)
	q := func(f float64) float64 { return d[int(f*float64(len(d)-1))] }
	fmt.Fprintf(w, "  %-64s %7.1f %7.1f %7.1f\n", name, q(0.25), q(0.5), q(0.75))
}
