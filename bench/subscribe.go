package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Subscribe mode holds Concurrency streams open on okso's streaming door:
// each is one POST /mcp/tools/call with Accept: text/event-stream, whose
// response is a Server-Sent Events stream of "metric" frames, "ping"s and
// a last "close" {code, reason}. The streams open at the start and are
// cancelled (their requests closed) when the time is up; frames count in
// the measured time only.

// CodeNotSSE is a stream answered 200 with something other than an event
// stream (e.g. a unary tool's JSON).
const CodeNotSSE = "http/not-event-stream"

// maxSSELine bounds one line of an event stream; a device frame is at most
// 64 KiB.
const maxSSELine = 1 << 20

// streamURL is the streaming door of the MCP endpoint u: its path replaced
// by /mcp/tools/call.
func streamURL(u string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return "", fmt.Errorf("url %q: want http(s)://host:port/mcp", u)
	}
	p.Path, p.RawPath, p.RawQuery, p.Fragment = "/mcp/tools/call", "", "", ""
	return p.String(), nil
}

// streamer is the state of one stream, owned by its goroutine until the
// run merges it.
type streamer struct {
	opened, held bool // got an event stream; was still open at the end
	frames       uint64
	pings        uint64
	first        time.Duration // request to first frame; 0: none
	code, msg    string        // why it failed or ended early
}

// live is what the progress line shows while the streams run.
type live struct {
	open   atomic.Int64
	frames atomic.Uint64 // warm-up included
	failed atomic.Uint64
}

// runSubscribe opens o.Concurrency streams round-robin over tools, holds
// them for the warm-up and the measured time, then cancels them all and
// fills in res.
func runSubscribe(ctx context.Context, o *Options, hc *http.Client, tools []string, res *Result) (*Result, error) {
	door, err := streamURL(o.URL)
	if err != nil {
		return nil, err
	}
	res.StreamURL = door
	bodies := make([][]byte, len(tools))
	for i, t := range tools {
		if bodies[i], err = json.Marshal(struct {
			Tool      string          `json:"tool"`
			Arguments json.RawMessage `json:"arguments"`
		}{t, o.Args}); err != nil {
			return nil, fmt.Errorf("args %s: %w", o.Args, err)
		}
	}

	var (
		streams = make([]streamer, o.Concurrency)
		lv      live
		wg      sync.WaitGroup
		start   = time.Now()
		end     = o.Warmup + o.Duration
	)
	// runCtx ends every stream: at the end of the time, or when ctx does.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range streams {
		st, body := &streams[i], bodies[i%len(bodies)]
		wg.Go(func() { st.run(runCtx, hc, door, body, start, o.Warmup, end, &lv) })
	}
	stop, progressDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(o.Progress, stop, start, o.Warmup, lv.frames.Load, func(n uint64, rate float64) string {
			return fmt.Sprintf("%7d open  %9d frames  %8.0f/s  %6d failed", lv.open.Load(), n, rate, lv.failed.Load())
		})
	}()
	timer := time.NewTimer(end)
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	timer.Stop()
	cancel()
	wg.Wait()
	close(stop)
	<-progressDone

	measured := max(min(time.Since(start), end)-o.Warmup, 0)
	res.Interrupted = ctx.Err() != nil
	res.Ops = uint64(len(streams))
	var first Histogram
	rates := StreamRates{Min: math.Inf(1)}
	for i := range streams {
		st := &streams[i]
		if st.first > 0 {
			first.Record(st.first)
		}
		if st.opened {
			res.StreamsOpened++
		}
		res.Frames += st.frames
		res.Pings += st.pings
		if st.held {
			res.StreamsOpen++
			if measured > 0 {
				r := float64(st.frames) / measured.Seconds()
				rates.Mean += r
				rates.Min, rates.Max = min(rates.Min, r), max(rates.Max, r)
			}
			continue
		}
		res.Errors[st.code]++
		if res.Examples == nil {
			res.Examples = map[string]string{}
		}
		if _, ok := res.Examples[st.code]; !ok {
			res.Examples[st.code] = st.msg
		}
	}
	res.OK = res.StreamsOpen
	if measured > 0 {
		res.Duration = measured.Seconds()
		res.FramesPerS = float64(res.Frames) / measured.Seconds()
		if res.StreamsOpen > 0 {
			rates.Mean /= float64(res.StreamsOpen)
			res.StreamFramesPS = &rates
		}
	}
	if first.Count() > 0 {
		ff := summarise(&first)
		res.FirstFrame = &ff
		for _, b := range first.Bins() {
			res.Histogram = append(res.Histogram, BinMS{LeMS: ms(b.Le), Count: b.Count})
		}
	}
	return res, nil
}

// run opens one stream and reads it until ctx ends (the stream is held to
// the end) or the stream fails first.
func (st *streamer) run(ctx context.Context, hc *http.Client, door string, body []byte,
	start time.Time, warmup, end time.Duration, lv *live) {
	defer func() {
		if !st.held {
			lv.failed.Add(1)
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, door, bytes.NewReader(body))
	if err != nil {
		st.code, st.msg = CodeTransport, err.Error()
		return
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		st.code, st.msg = classifyErr(ctx, err)
		if ctx.Err() != nil {
			st.msg = "not open when the run ended: " + st.msg
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		st.code = fmt.Sprintf("http/%d", resp.StatusCode)
		st.msg = strings.TrimSpace(resp.Status + " " + string(b))
		return
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		st.code, st.msg = CodeNotSSE, "Content-Type "+ct
		return
	}
	st.opened = true
	lv.open.Add(1)
	defer lv.open.Add(-1)

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4<<10), maxSSELine)
	var (
		event   string
		data    []byte // reused: only a close event's is read
		hasData bool
	)
	for sc.Scan() {
		field, value, _ := strings.Cut(sc.Text(), ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			event = value
			continue
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data, hasData = append(data, value...), true
			continue
		case "":
			// A blank line ends an event (a line starting with ':' is a
			// comment and also lands here, with data to keep).
			if sc.Text() != "" {
				continue
			}
		default:
			continue
		}
		now := time.Since(start)
		counted := now >= warmup && now < end
		switch event {
		case "metric":
			lv.frames.Add(1)
			if st.first == 0 {
				st.first = max(time.Since(t0), 1)
			}
			if counted {
				st.frames++
			}
		case "ping":
			if counted {
				st.pings++
			}
		case "close":
			var c struct {
				Code   int    `json:"code"`
				Reason string `json:"reason"`
			}
			if json.Unmarshal(data, &c) != nil {
				st.code, st.msg = "close/?", string(data)
				return
			}
			st.code, st.msg = fmt.Sprintf("close/%d", c.Code), c.Reason
			return
		}
		event, data, hasData = "", data[:0], false
	}
	if ctx.Err() != nil {
		st.held = true // the run ended it
		return
	}
	if err := sc.Err(); err != nil {
		st.code, st.msg = classifyErr(ctx, err)
		return
	}
	st.code, st.msg = CodeClosed, "the event stream ended without a close event"
}
