package roles

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/run"
)

// logSink is a log (or any output) that a test can wait on, line by
// line: each line as text, and JSON lines decoded too.
type logSink struct {
	mu      sync.Mutex
	raw     bytes.Buffer
	partial []byte // the last line, until its newline comes
	text    []string
	lines   []map[string]any
	changed chan struct{} // closed when a line comes
}

func newLogSink() *logSink { return &logSink{changed: make(chan struct{})} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raw.Write(p)
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		l := bytes.TrimSuffix(s.partial[:i], []byte("\r"))
		s.text = append(s.text, string(l))
		var m map[string]any
		if json.Unmarshal(l, &m) == nil {
			s.lines = append(s.lines, m)
		}
		s.partial = s.partial[i+1:]
	}
	close(s.changed)
	s.changed = make(chan struct{})
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.raw.String()
}

// count returns how many JSON lines match.
func (s *logSink) count(match func(map[string]any) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		if match(l) {
			n++
		}
	}
	return n
}

// wait returns the first JSON line that matches, waiting for it up to 15 s.
func (s *logSink) wait(t *testing.T, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	var found map[string]any
	s.await(t, what, func() bool {
		for _, l := range s.lines {
			if match(l) {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

// waitText returns the first line that matches, as text, waiting for it
// up to 15 s.
func (s *logSink) waitText(t *testing.T, what string, match func(string) bool) string {
	t.Helper()
	var found string
	s.await(t, what, func() bool {
		for _, l := range s.text {
			if match(l) {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

// textLines returns the lines so far.
func (s *logSink) textLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.text)
}

// await waits until found, called with s.mu held, reports true.
func (s *logSink) await(t *testing.T, what string, found func() bool) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		s.mu.Lock()
		ok, changed := found(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no line: %s; the output:\n%s", what, s)
		}
	}
}

// line matches a line with message msg whose attributes include attrs
// (numbers as JSON decodes them, float64).
func line(msg string, attrs ...any) func(map[string]any) bool {
	return func(m map[string]any) bool {
		if m["msg"] != msg {
			return false
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if m[attrs[i].(string)] != attrs[i+1] {
				return false
			}
		}
		return true
	}
}

// runParts runs the actors add adds until stop, which waits for them.
func runParts(t *testing.T, add func(*run.Group)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runGroup(ctx, add) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("parts stopped with %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Error("parts did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// startTier starts a device tier on addr, on np, until the returned stop.
func startTier(t *testing.T, c *common, np *natsPart, addr string) (*tierPart, func()) {
	t.Helper()
	tp, err := newTierPart(t.Context(), c, np, tierConfig{Addr: addr, LeaseTTL: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stopRun := runParts(t, tp.actors)
	var once sync.Once
	stop := func() { once.Do(func() { stopRun(); tp.close() }) }
	t.Cleanup(stop)
	return tp, stop
}

// TestDeviceRolesSayWhenTheTierGoesAway stops the device tier under a
// fleet of mock devices and an agent, and starts a new one on the same
// address: the fleet writes one line when its devices lose the tier and
// one when they are all back, counting them, and so does the agent for
// itself. Stopping them afterwards is no outage.
func TestDeviceRolesSayWhenTheTierGoesAway(t *testing.T) {
	const devices = 20
	logs, c, np := deviceRolesBase(t)
	tier, stopTier := startTier(t, c, np, "127.0.0.1:0")
	addr := tier.http.addr()
	urls := []string{tier.url()}

	fleet, err := newFleetPart(c, fleetMock, devices, DefaultTenant, urls, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	fleet.watch.window = 200 * time.Millisecond
	agent, err := newAgentPart(c, agentSpec{urls: urls, dataDir: t.TempDir(), tenant: DefaultTenant})
	if err != nil {
		t.Fatal(err)
	}
	stopDevices := runParts(t, func(g *run.Group) { fleet.actors(g); agent.actors(g) })
	logs.wait(t, "fleet connected", line("mock devices connected", "count", float64(devices)))
	logs.wait(t, "agent connected", line("agent connected"))

	stopTier()
	lost := logs.wait(t, "fleet lost the tier", line("device tier unreachable", "role", "mock-fleet"))
	if lost["disconnected"] != float64(devices) || lost["of"] != float64(devices) {
		t.Errorf("fleet's line %v, want all %d devices disconnected", lost, devices)
	}
	logs.wait(t, "agent lost the tier", line("device tier unreachable", "role", "agent", "disconnected", 1.0))

	_, _ = startTier(t, c, np, addr)
	logs.wait(t, "fleet back", line("device tier back", "role", "mock-fleet", "connected", float64(devices)))
	logs.wait(t, "agent back", line("device tier back", "role", "agent", "connected", 1.0))

	stopDevices()
	for _, role := range []string{"mock-fleet", "agent"} {
		for _, msg := range []string{"device tier unreachable", "device tier back"} {
			if n := logs.count(line(msg, "role", role)); n != 1 {
				t.Errorf("%d lines %q of %s, want 1", n, msg, role)
			}
		}
	}
}

// TestAgentConnectsInOneLine starts an agent before its tier: it says at
// once that the tier is unreachable, then that it is connected in one
// line (with how long it waited) rather than that and "device tier back";
// a later reconnect is the one "device tier back" line.
func TestAgentConnectsInOneLine(t *testing.T) {
	logs, c, np := deviceRolesBase(t)
	tier, stopTier := startTier(t, c, np, "127.0.0.1:0")
	addr, urls := tier.http.addr(), []string{tier.url()}
	stopTier()

	agent, err := newAgentPart(c, agentSpec{urls: urls, dataDir: t.TempDir(), tenant: DefaultTenant})
	if err != nil {
		t.Fatal(err)
	}
	stopAgent := runParts(t, agent.actors)
	logs.wait(t, "agent cannot reach the tier", line("device tier unreachable", "role", "agent"))
	_, stopTier = startTier(t, c, np, addr)
	connected := logs.wait(t, "agent connected", line("agent connected", "role", "agent"))
	if connected["connected"] != 1.0 || connected["down_for"] == nil || connected["tools"] == nil {
		t.Errorf("agent connected %v: want tools, connected 1 and how long it was down", connected)
	}
	if n := logs.count(line("device tier back", "role", "agent")); n != 0 {
		t.Errorf("the first connection wrote %d lines device tier back as well", n)
	}

	stopTier()
	logs.wait(t, "agent lost the tier", line("device tier unreachable", "role", "agent", "disconnected", 1.0))
	_, _ = startTier(t, c, np, addr)
	logs.wait(t, "agent back", line("device tier back", "role", "agent", "connected", 1.0))
	stopAgent()
	if n := logs.count(line("agent connected")); n != 1 {
		t.Errorf("%d lines agent connected, want 1:\n%s", n, logs)
	}
}

// TestTierSaysWhenNATSGoesAway cuts the device tier's link to NATS: the
// tier writes one line when it is lost and one when its connection is
// back; closing it at the end is no loss.
func TestTierSaysWhenNATSGoesAway(t *testing.T) {
	logs := newLogSink()
	c, err := loadCommon(slog.New(slog.NewJSONHandler(logs, nil)), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	server, err := openNATS(t.Context(), natsConfig{Listen: "127.0.0.1:0", natsSecurity: natsSecurity{Insecure: true}}) // links, not credentials
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.close) // after the relay's and the tier's cleanups
	r := startRelay(t, strings.TrimPrefix(server.clientURL(), "nats://"))
	np, err := openNATS(t.Context(), natsConfig{URL: "nats://" + r.addr})
	if err != nil {
		t.Fatal(err)
	}
	_, stopTier := startTier(t, c, np, "127.0.0.1:0")

	r.cut()
	lost := logs.wait(t, "connection lost", line("NATS connection lost", "role", "device"))
	if lost["err"] == nil {
		t.Errorf("line %v gives no reason", lost)
	}
	r.restore()
	logs.wait(t, "connection back", line("NATS connection back", "role", "device"))

	stopTier()
	for _, msg := range []string{"NATS connection lost", "NATS connection back"} {
		if n := logs.count(line(msg)); n != 1 {
			t.Errorf("%d lines %q, want 1", n, msg)
		}
	}
}

// TestLinkWatch: one outage is two lines whatever happens in it: devices
// lost one after another, a device lost twice (counted once), a device
// refused for good (waited for no more).
func TestLinkWatch(t *testing.T) {
	logs := newLogSink()
	w := newLinkWatch(slog.New(slog.NewJSONHandler(logs, nil)), 0)
	a, b, c := w.add(), w.add(), w.add()
	a.ready()
	b.ready()
	c.ready()
	if n := logs.count(func(map[string]any) bool { return true }); n != 0 {
		t.Fatalf("%d lines before any loss:\n%s", n, logs)
	}
	a.lost(errors.New("gone"))
	b.lost(errors.New("gone"))
	a.ready()
	a.lost(errors.New("gone again"))
	c.refused()
	if n := logs.count(line("device tier back")); n != 0 {
		t.Fatalf("back while two devices are still down:\n%s", logs)
	}
	b.ready()
	a.ready()
	lost := logs.wait(t, "unreachable", line("device tier unreachable"))
	if lost["disconnected"] != 1.0 || lost["err"] != "gone" {
		t.Errorf("unreachable line %v, want the first loss (1 device, gone)", lost)
	}
	back := logs.wait(t, "back", line("device tier back"))
	if back["connected"] != 2.0 || back["of"] != 2.0 || back["lost"] != 2.0 {
		t.Errorf("back line %v, want 2 of 2 connected after losing 2", back)
	}
	// A second outage is two lines more; after stop, nothing.
	b.lost(nil)
	b.ready()
	w.stop()
	a.lost(nil)
	a.ready()
	for _, msg := range []string{"device tier unreachable", "device tier back"} {
		if n := logs.count(line(msg)); n != 2 {
			t.Errorf("%d lines %q, want 2:\n%s", n, msg, logs)
		}
	}
}

// deviceRolesBase is what the device roles' tests stand on: a log they
// read, the common parts of a fresh data dir, and an embedded NATS.
func deviceRolesBase(t *testing.T) (*logSink, *common, *natsPart) {
	t.Helper()
	logs := newLogSink()
	c, err := loadCommon(slog.New(slog.NewJSONHandler(logs, nil)), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	np, err := openNATS(t.Context(), natsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(np.close) // after the parts' own cleanups
	return logs, c, np
}
