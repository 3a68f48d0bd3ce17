package mcp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

const testNode = "01hzx9k3m4p7q8r9s0t1v2w3xy"

func newTestStream(t *testing.T) *stream {
	t.Helper()
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	return &stream{all: newStreams(nil, 256), id: "s", frame: embedded{set, schemas.MetricsFrame}, nodeID: testNode,
		frames: make(chan []byte, StreamBuffer), done: make(chan struct{})}
}

// metricFrame is a valid frame. Its timestamp is fixed: the synctest clock
// starts in 2000, before the schema's minimum.
func metricFrame(node string) []byte {
	return fmt.Appendf(nil, `{"ts_ms":1745300000000,"node_id":%q,"cpu_pct":12.5,"mem_bytes":1000,"mem_total_bytes":4000,`+
		`"disk_pct":40,"load_1m":0.5,"load_5m":0.4,"load_15m":0.3}`, node)
}

// connSink is an SSE sink over a net.Conn (a net.Pipe in these tests, whose
// writes block until the other end reads, like a full TCP window).
type connSink struct{ c net.Conn }

func (s connSink) send(_ context.Context, event string, data []byte) error {
	_, err := fmt.Fprintf(s.c, "event: %s\ndata: %s\n\n", event, data)
	return err
}

func (s connSink) setWriteDeadline(t time.Time) error { return s.c.SetWriteDeadline(t) }

type sseEvent struct {
	event, data string
	at          time.Time
}

// readEvents parses SSE events from c until it closes.
func readEvents(c net.Conn) <-chan sseEvent {
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(c)
		var e sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				e.event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				e.data = strings.TrimPrefix(line, "data: ")
			case line == "":
				e.at = time.Now()
				ch <- e
				e = sseEvent{}
			}
		}
	}()
	return ch
}

// feedFrames plays a device: one frame every interval until stop.
func feedFrames(s *stream, interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			s.onFrame(&nats.Msg{Data: metricFrame(testNode), Header: nats.Header{}})
		}
	}
}

// Fixture 1 of seed 001 §9: a client that reads promptly for 30 s gets at
// least 6 frames at 5 s, a ping at 25 s, and a normal close when it leaves.
func TestStreamNormal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestStream(t)
		srv, cli := net.Pipe()
		stop := make(chan struct{})
		go feedFrames(s, 5*time.Second, stop)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		code := make(chan int, 1)
		go func() {
			code <- s.pump(ctx, connSink{srv}, DefaultPingInterval, DefaultIdleTimeout, metricEvent)
			srv.Close()
		}()
		events := readEvents(cli)
		start := time.Now()
		leave := time.After(30*time.Second + time.Millisecond)
		var metrics, pings int
		var last sseEvent
	read:
		for {
			select {
			case e, ok := <-events:
				if !ok {
					break read
				}
				switch e.event {
				case "metric":
					metrics++
					if json.Valid([]byte(e.data)) == false {
						t.Errorf("metric data is not JSON: %s", e.data)
					}
				case "ping":
					pings++
					if e.data != "{}" || e.at.Sub(start) != 25*time.Second {
						t.Errorf("ping %q at %v, want {} at 25s", e.data, e.at.Sub(start))
					}
				}
				last = e
			case <-leave:
				cancel()
				leave = nil
			}
		}
		close(stop)
		if metrics < 6 || pings < 1 {
			t.Errorf("got %d metrics and %d pings, want >= 6 and >= 1", metrics, pings)
		}
		if last.event != "close" || last.data != `{"code":1000,"reason":"normal"}` {
			t.Errorf("last event %q %s, want close 1000 normal", last.event, last.data)
		}
		if c := <-code; c != bus.StreamNormal {
			t.Errorf("pump returned %d", c)
		}
	})
}

// Fixture 2: a client that stops reading is closed with 4408 after 90 s
// without read progress.
func TestStreamIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestStream(t)
		srv, cli := net.Pipe()
		defer cli.Close()
		stop := make(chan struct{})
		defer close(stop)
		go feedFrames(s, 60*time.Second, stop) // rare frames: the buffer never fills first
		start := time.Now()
		code := s.pump(t.Context(), connSink{srv}, DefaultPingInterval, DefaultIdleTimeout, metricEvent)
		stalled := time.Since(start)
		srv.Close()
		if code != bus.StreamIdleTimeout {
			t.Fatalf("code %d, want 4408", code)
		}
		// The first write (the ping at 25 s) never completes.
		if want := DefaultPingInterval + DefaultIdleTimeout; stalled < want || stalled > want+closeWriteTimeout {
			t.Errorf("closed after %v, want %v", stalled, want)
		}
	})
}

// A client more than 3 frames behind is closed with 4413.
func TestStreamBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestStream(t)
		srv, cli := net.Pipe()
		defer cli.Close()
		stop := make(chan struct{})
		defer close(stop)
		go feedFrames(s, time.Second, stop)
		start := time.Now()
		code := s.pump(t.Context(), connSink{srv}, DefaultPingInterval, DefaultIdleTimeout, metricEvent)
		srv.Close()
		if code != bus.StreamBackpressure {
			t.Fatalf("code %d, want 4413", code)
		}
		// Frame 1 is stuck in the write, frames 2-4 fill the buffer, frame 5
		// overflows; the stuck write and then the close event each get
		// closeWriteTimeout.
		if d := time.Since(start); d != 5*time.Second+2*closeWriteTimeout {
			t.Errorf("closed after %v, want 5s + 2 close write timeouts", d)
		}
	})
}

// Fixture 3: the device goes away mid-stream: 4503.
func TestStreamDeviceOffline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestStream(t)
		srv, cli := net.Pipe()
		stop := make(chan struct{})
		go feedFrames(s, time.Second, stop)
		code := make(chan int, 1)
		go func() {
			code <- s.pump(t.Context(), connSink{srv}, DefaultPingInterval, DefaultIdleTimeout, metricEvent)
			srv.Close()
		}()
		events := readEvents(cli)
		var metrics int
		var last sseEvent
		giveUp := time.AfterFunc(time.Minute, func() { cli.Close() })
		defer giveUp.Stop()
		for e := range events {
			if e.event == "metric" {
				if metrics++; metrics == 3 {
					close(stop)
					s.onFrame(&nats.Msg{Header: nats.Header{bus.HeaderStreamEnd: {bus.ReasonDeviceOffline}}})
				}
			}
			last = e
		}
		if last.event != "close" || last.data != `{"code":4503,"reason":"device_offline"}` {
			t.Errorf("last event %q %s, want close 4503", last.event, last.data)
		}
		if c := <-code; c != bus.StreamDeviceOffline {
			t.Errorf("pump returned %d", c)
		}
	})
}

// Frames that fail the frame schema, or name another node, are dropped and
// counted; a frame with newlines is compacted to one SSE data line.
func TestStreamFrameChecks(t *testing.T) {
	s := newTestStream(t)
	bad := [][]byte{
		[]byte(`{"ts_ms":1}`),
		metricFrame("01hzx9k3m4p7q8r9s0t1v2w3xz"),
		[]byte(strings.Replace(string(metricFrame(testNode)), `"cpu_pct":12.5`, `"cpu_pct":101`, 1)),
		[]byte(`not json`),
		append(metricFrame(testNode)[:len(metricFrame(testNode))-1], `,"extra":1}`...),
	}
	for _, f := range bad {
		s.onFrame(&nats.Msg{Data: f, Header: nats.Header{}})
	}
	if got := s.all.dropped.Load(); got != int64(len(bad)) {
		t.Errorf("dropped %d frames, want %d", got, len(bad))
	}
	if len(s.frames) != 0 {
		t.Fatalf("%d bad frames were queued", len(s.frames))
	}
	spaced := strings.ReplaceAll(string(metricFrame(testNode)), ",", ",\n\n")
	s.onFrame(&nats.Msg{Data: []byte(spaced), Header: nats.Header{}})
	f := <-s.frames
	if strings.ContainsAny(string(f), "\r\n") || !json.Valid(f) {
		t.Errorf("forwarded frame %q is not one line of JSON", f)
	}
}
