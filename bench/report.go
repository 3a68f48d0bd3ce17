package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// WriteText prints r for people: the rate, the errors by code, the latency
// percentiles and a histogram.
func (r *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	op := "calls"
	if r.Mode == ModeSubscribe {
		r.writeStreams(&b)
		r.writeHistogram(&b)
		_, err := io.WriteString(w, b.String())
		return err
	}
	if r.Mode == ModeList {
		fmt.Fprintf(&b, "okso bench: tools/list at %s (%d tools, %d pages per listing)\n", r.URL, r.Tools, r.PagesPerList)
		op = "lists"
	} else {
		fmt.Fprintf(&b, "okso bench: tools/call %s (%d tools) at %s\n", r.Tool, r.Tools, r.URL)
	}
	interrupted := ""
	if r.Interrupted {
		interrupted = ", INTERRUPTED"
	}
	if r.Mode == ModeRaw {
		fmt.Fprintf(&b, "  raw HTTP, %d connections, each answer checked, protocol %s, %s measured after %s warm-up%s\n",
			r.Concurrency, r.Protocol, secs(r.Duration), secs(r.Warmup), interrupted)
	} else {
		fmt.Fprintf(&b, "  %d sessions, %d in flight, protocol %s, %s measured after %s warm-up%s\n",
			r.Sessions, r.Concurrency, r.Protocol, secs(r.Duration), secs(r.Warmup), interrupted)
	}
	fmt.Fprintf(&b, "  %-10s %.1f ok (%.1f in all)\n", op+"/s", r.OKPerS, r.OpsPerS)
	fmt.Fprintf(&b, "  %-10s %d\n", "ok", r.OK)
	fmt.Fprintf(&b, "  %-10s %d\n", "errors", r.Ops-r.OK)
	r.writeErrors(&b)
	if r.Reconnects > 0 {
		what := "sessions"
		if r.Mode == ModeRaw {
			what = "connections"
		}
		fmt.Fprintf(&b, "  %-10s %d %s opened again\n", "reconnects", r.Reconnects, what)
	}
	fmt.Fprintf(&b, "  %-10s %s (of ok %s)\n", "latency", r.Latency.line(), op)
	if r.PageLatency != nil {
		fmt.Fprintf(&b, "  %-10s %s (%d pages)\n", "per page", r.PageLatency.line(), r.Pages)
	}
	r.writeHistogram(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeStreams prints a subscribe run: the streams, the frame rate and
// the time to first frame.
func (r *Result) writeStreams(b *strings.Builder) {
	fmt.Fprintf(b, "okso bench: subscribe %s (%d tools) at %s\n", r.Tool, r.Tools, r.StreamURL)
	interrupted := ""
	if r.Interrupted {
		interrupted = ", INTERRUPTED"
	}
	fmt.Fprintf(b, "  %d streams, %s measured after %s warm-up%s\n",
		r.Concurrency, secs(r.Duration), secs(r.Warmup), interrupted)
	fmt.Fprintf(b, "  %-10s %d open to the end, %d opened, %d failed\n", "streams",
		r.StreamsOpen, r.StreamsOpened, r.Ops-r.OK)
	r.writeErrors(b)
	fmt.Fprintf(b, "  %-10s %.1f in all (%d frames)\n", "frames/s", r.FramesPerS, r.Frames)
	if s := r.StreamFramesPS; s != nil {
		fmt.Fprintf(b, "  %-10s %.3f mean, %.3f min, %.3f max (streams open to the end)\n", "per stream",
			s.Mean, s.Min, s.Max)
	}
	if r.Pings > 0 {
		fmt.Fprintf(b, "  %-10s %d\n", "pings", r.Pings)
	}
	if r.FirstFrame != nil {
		fmt.Fprintf(b, "  %-10s %s (request to first frame)\n", "1st frame", r.FirstFrame.line())
	}
}

func (r *Result) writeErrors(b *strings.Builder) {
	for _, code := range slices.Sorted(maps.Keys(r.Errors)) {
		ex := r.Examples[code]
		if len(ex) > 120 {
			ex = ex[:117] + "..."
		}
		fmt.Fprintf(b, "    %-28s %8d  %s\n", code, r.Errors[code], ex)
	}
}

func (r *Result) writeHistogram(b *strings.Builder) {
	if len(r.Histogram) == 0 {
		return
	}
	var top, total uint64
	for _, h := range r.Histogram {
		top = max(top, h.Count)
		total += h.Count
	}
	const width = 40
	fmt.Fprintf(b, "  histogram\n")
	for _, h := range r.Histogram {
		bar := int((h.Count*width + top - 1) / top)
		fmt.Fprintf(b, "    ≤ %-8s |%-*s| %9d %5.1f%%\n", short(fromMS(h.LeMS)), width,
			strings.Repeat("#", bar), h.Count, 100*float64(h.Count)/float64(total))
	}
}

func (l Latency) line() string {
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s  (min %s, mean %s)",
		short(fromMS(l.P50)), short(fromMS(l.P90)), short(fromMS(l.P99)), short(fromMS(l.Max)),
		short(fromMS(l.Min)), short(fromMS(l.Mean)))
}

func fromMS(v float64) time.Duration { return time.Duration(v * 1e6) }

func secs(s float64) string { return short(time.Duration(s * float64(time.Second))) }

// short rounds d to three significant digits.
func short(d time.Duration) string {
	unit := time.Duration(1)
	for lim := 1000 * time.Nanosecond; d >= lim && unit < time.Second; lim *= 10 {
		unit *= 10
	}
	return d.Round(unit).String()
}
