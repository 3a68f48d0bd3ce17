package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// Stream defaults (seed 001 §5–7).
const (
	DefaultPingInterval = 25 * time.Second
	DefaultIdleTimeout  = 90 * time.Second
	StreamBuffer        = 3 // frames a client may fall behind before 4413
	closeWriteTimeout   = time.Second
)

// sink is where one stream's events go: an SSE response, or the progress
// notifications of an MCP call.
type sink interface {
	// send delivers one event, within ctx; it returns once the event is
	// written.
	send(ctx context.Context, event string, data []byte) error
	// setWriteDeadline bounds the send in progress and later ones; a
	// deadline in the past unblocks a stuck send.
	setWriteDeadline(t time.Time) error
}

// stream is one open subscription, from the gateway's side. Frames from
// NATS go into a buffer of [StreamBuffer]; the pump writes them to a sink.
type stream struct {
	all    *streams // the gateway's, which counts it
	id     string
	frame  validator // of each frame
	nodeID string
	tenant string
	sub    *nats.Subscription
	frames chan []byte

	once   sync.Once
	code   atomic.Int32 // the close code once decided
	done   chan struct{}
	sinkMu sync.Mutex
	sink   sink // set by pump; end unblocks it
	count  atomic.Int64
}

// end decides the stream's close code (first caller wins). A send in
// progress gets closeWriteTimeout more to finish (a client that is slow
// but reading then still gets the close event); one stuck on a client that
// stopped reading is cut then.
func (s *stream) end(code int) {
	s.once.Do(func() {
		s.code.Store(int32(code))
		close(s.done)
		s.sinkMu.Lock()
		if s.sink != nil {
			_ = s.sink.setWriteDeadline(time.Now().Add(closeWriteTimeout))
		}
		s.sinkMu.Unlock()
	})
}

func (s *stream) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// onFrame is the NATS callback of the stream subject.
func (s *stream) onFrame(m *nats.Msg) {
	if m.Header.Get(bus.HeaderStreamEnd) != "" {
		s.end(bus.StreamDeviceOffline)
		return
	}
	data, ok := s.all.validFrame(s.frame, s.nodeID, m.Data)
	if !ok {
		return
	}
	select {
	case s.frames <- data:
	default:
		s.end(bus.StreamBackpressure)
	}
}

// streams are the streams a gateway holds open: a quota per tenant, and
// by node (they end when the node goes). Safe for concurrent use.
type streams struct {
	nc        *nats.Conn
	perTenant int // at most this many per tenant
	dropped   atomic.Int64

	mu       sync.Mutex
	byTenant map[string]int
	byNode   map[string]map[*stream]struct{}
}

func newStreams(nc *nats.Conn, perTenant int) *streams {
	return &streams{nc: nc, perTenant: perTenant, byTenant: map[string]int{}, byNode: map[string]map[*stream]struct{}{}}
}

// validFrame checks one frame against its schema and the addressed node,
// and returns it compacted to one line (a device's newlines must never
// reach an SSE stream). A frame that fails is dropped and counted.
func (st *streams) validFrame(frame validator, nodeID string, data []byte) ([]byte, bool) {
	if frame.validate(data) != nil {
		st.dropped.Add(1)
		return nil, false
	}
	var who struct {
		NodeID string `json:"node_id"`
	}
	var buf bytes.Buffer
	if json.Unmarshal(data, &who) != nil || who.NodeID != nodeID || json.Compact(&buf, data) != nil {
		st.dropped.Add(1)
		return nil, false
	}
	return buf.Bytes(), true
}

// open is the number of streams held open.
func (st *streams) open() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	n := 0
	for _, c := range st.byTenant {
		n += c
	}
	return n
}

// errQuota means the tenant holds as many streams as it may.
var errQuota = errors.New("stream quota")

// openStream subscribes to a new stream subject and asks the node to start
// it, over h. On success the caller must call close.
func (c *callCtx) openStream(ctx context.Context, args json.RawMessage, nodeID string, h hop) (*stream, *schemas.Error, error) {
	st := c.g.streams
	if !st.take(c.claims.Tenant) {
		c.audit(bus.DecisionRateLimit, strconv.Itoa(bus.StreamRateLimited))
		return nil, nil, errQuota
	}
	s := &stream{
		all:    st,
		id:     strings.ToLower(ulid.Make().String()),
		frame:  c.entry.output,
		nodeID: nodeID,
		tenant: c.claims.Tenant,
		frames: make(chan []byte, StreamBuffer),
		done:   make(chan struct{}),
	}
	sub, err := st.nc.Subscribe(bus.Stream(s.id), s.onFrame)
	if err == nil {
		err = st.nc.FlushTimeout(5 * time.Second)
	}
	if err != nil {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		st.release(s.tenant)
		return nil, c.fail(schemas.CodeInternal, "message bus unavailable"), nil
	}
	s.sub = sub
	st.track(s, true)
	h.header = nats.Header{bus.HeaderStreamID: {s.id}}
	if _, e := c.request(ctx, args, h); e != nil {
		// After a timeout the device may have started: stop it.
		s.close(e.Code == schemas.CodeDeadlineExceeded)
		return nil, e, nil
	}
	c.audit(bus.DecisionAllowed, "")
	return s, nil, nil
}

// close stops the stream on every side: the subscription, the device (a
// cancel on the node's subject, unless the device is gone) and the quota.
func (s *stream) close(cancelDevice bool) {
	_ = s.sub.Unsubscribe()
	if cancelDevice {
		_ = s.all.nc.Publish(bus.NodeCancel(s.nodeID), []byte(s.id))
	}
	s.all.track(s, false)
	s.all.release(s.tenant)
}

// take takes one of a tenant's stream slots (a stream, or a listen,
// holds one); false when it holds them all.
func (st *streams) take(tenant string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byTenant[tenant] >= st.perTenant {
		return false
	}
	st.byTenant[tenant]++
	return true
}

// release gives back a slot take took.
func (st *streams) release(tenant string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byTenant[tenant]--; st.byTenant[tenant] <= 0 {
		delete(st.byTenant, tenant)
	}
}

// track adds or removes s from the streams of its node, which end with
// 4503 when the registry says the node went away.
func (st *streams) track(s *stream, add bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	set := st.byNode[s.nodeID]
	if add {
		if set == nil {
			set = map[*stream]struct{}{}
			st.byNode[s.nodeID] = set
		}
		set[s] = struct{}{}
		return
	}
	delete(set, s)
	if len(set) == 0 {
		delete(st.byNode, s.nodeID)
	}
}

// StreamView is a read-only look at the streams a gateway holds open
// ([Gateway.Streams]). It is safe for concurrent use.
type StreamView struct{ st *streams }

// Open is the number of streams the gateway holds open.
func (v StreamView) Open() int { return v.st.open() }

// Dropped is the number of stream frames dropped for failing their
// schema or naming another node.
func (v StreamView) Dropped() int64 { return v.st.dropped.Load() }

// closeAll ends every open stream with 1000 (the gateway is stopping);
// each client gets its close event.
func (st *streams) closeAll() {
	st.mu.Lock()
	var ss []*stream
	for _, set := range st.byNode {
		for s := range set {
			ss = append(ss, s)
		}
	}
	st.mu.Unlock()
	for _, s := range ss {
		s.end(bus.StreamNormal)
	}
}

// nodeGone ends every stream of a node that left the registry.
func (st *streams) nodeGone(nodeID string) {
	st.mu.Lock()
	var ss []*stream
	for s := range st.byNode[nodeID] {
		ss = append(ss, s)
	}
	st.mu.Unlock()
	for _, s := range ss {
		s.end(bus.StreamDeviceOffline)
	}
}

// pump writes the stream's events to out until the stream ends: frames as
// they come, a ping every ping interval, and a last close event. ctx ending
// (client gone or gateway stopping) is a normal close. It returns the close
// code.
func (s *stream) pump(ctx context.Context, out sink, ping, idle time.Duration, frame func([]byte) (string, []byte)) int {
	s.sinkMu.Lock()
	s.sink = out
	s.sinkMu.Unlock()
	select {
	case <-s.done: // ended before the pump started
		_ = out.setWriteDeadline(time.Time{})
	default:
	}
	send := func(event string, data []byte) bool {
		if err := out.setWriteDeadline(time.Now().Add(idle)); err != nil {
			return false
		}
		if s.ended() { // end ran just before: keep its shorter deadline
			_ = out.setWriteDeadline(time.Now().Add(closeWriteTimeout))
		}
		if err := out.send(ctx, event, data); err != nil {
			if errors.Is(err, errDeadline) || isTimeout(err) {
				s.end(bus.StreamIdleTimeout) // no-op if backpressure came first
			} else {
				s.end(bus.StreamNormal) // the client went away
			}
			return false
		}
		return true
	}
	ticker := time.NewTicker(ping)
	defer ticker.Stop()
loop:
	for {
		select {
		case <-s.done: // an ended stream sends nothing more
			break loop
		default:
		}
		select {
		case <-ctx.Done():
			s.end(bus.StreamNormal)
			break loop
		case <-s.done:
			break loop
		case f := <-s.frames:
			ev, data := frame(f)
			if !send(ev, data) {
				break loop
			}
			s.count.Add(1)
		case <-ticker.C:
			if !send("ping", []byte("{}")) {
				break loop
			}
		}
	}
	code := int(s.code.Load())
	// The close event is best effort: a client that stopped reading will
	// not get it.
	_ = out.setWriteDeadline(time.Now().Add(closeWriteTimeout))
	b, _ := json.Marshal(struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
	}{code, bus.StreamReason(code)})
	_ = out.send(ctx, "close", b)
	return code
}

// errDeadline is returned by sinks whose deadline passed.
var errDeadline = errors.New("write deadline exceeded")

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
