package interop

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// goroutineHeader starts one goroutine of a Go traceback: its number, and
// what it waits on (with for how long, once a minute has passed); a crash
// traceback (SIGQUIT) names the goroutine's g and m in between.
var goroutineHeader = regexp.MustCompile(`^goroutine \d+ [^[]*\[([^\]]+)\]:$`)

// frameArgs are what differs between goroutines waiting at one place: a
// frame's argument words, the goroutine that created it.
var frameArgs = regexp.MustCompile(`\([^()]*\)$| in goroutine \d+$`)

// stackSummary condenses the traceback a Go process writes on SIGQUIT into
// one line per distinct place okso's goroutines wait: the wait, and the
// innermost frames of okso's own code and of the MCP SDK, with how many
// goroutines wait there. It is what a failed test prints of a process
// that did not answer: the full traceback of a race-built okso runs to
// hundreds of KiB, the places are a few dozen lines.
func stackSummary(log string) string {
	counts := map[string]int{}
	var order []string
	flush := func(state string, frames []string) {
		if state == "" || len(frames) == 0 {
			return
		}
		key := state + "\n    " + strings.Join(frames, "\n    ")
		if counts[key] == 0 {
			order = append(order, key)
		}
		counts[key]++
	}
	var state string
	var frames []string
	for line := range strings.SplitSeq(log, "\n") {
		if m := goroutineHeader.FindStringSubmatch(line); m != nil {
			flush(state, frames)
			state, frames = m[1], nil
			continue
		}
		if state == "" || strings.HasPrefix(line, "\t") || len(frames) >= 4 {
			continue
		}
		if strings.Contains(line, "okso-io/okso") || strings.Contains(line, "modelcontextprotocol/go-sdk") {
			frame := frameArgs.ReplaceAllString(strings.TrimSpace(line), "")
			frames = append(frames, frame)
		}
	}
	flush(state, frames)
	if len(order) == 0 {
		return "(no goroutine traceback in the log)"
	}
	slices.SortStableFunc(order, func(a, b string) int { return counts[b] - counts[a] })
	var b strings.Builder
	for _, k := range order {
		fmt.Fprintf(&b, "%d × %s\n", counts[k], k)
	}
	return b.String()
}
