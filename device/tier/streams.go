package tier

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// tierStream is one subscription a session serves: the device sends
// stream frames in reply to cmd cmdID; the tier publishes them on subject.
type tierStream struct {
	cmdID   string
	id      string // the gateway's stream id
	subject string
	cap     *capState
	start   time.Time
	reqID   string
	caller  string // the caller's subject, for the audit
}

// openStream starts a subscription for a request on a streaming verb: it
// sends the cmd to the device and answers the request at once; frames
// follow on the stream subject. Called from onCall with s.mu not held.
func (s *session) openStream(ctx context.Context, m *nats.Msg, call bus.Call, cs *capState, args []byte, fail func(code, msg, decision, tool string)) {
	sid := m.Header.Get(bus.HeaderStreamID)
	if !schemas.ValidID(sid) {
		fail(schemas.CodeBadRequest, "streaming call without a valid stream id", bus.DecisionInvalid, call.Tool)
		return
	}
	cmdID := wire.NewMsgID()
	frame, err := wire.EncodeID(wire.TypeCmd, cmdID, "", wire.Cmd{Tool: call.Tool, Arguments: args,
		RequestID: m.Header.Get(bus.HeaderRequestID)})
	if err != nil {
		fail(schemas.CodeBadRequest, "malformed arguments", bus.DecisionInvalid, call.Tool)
		return
	}
	st := &tierStream{cmdID: cmdID, id: sid, subject: bus.Stream(sid), cap: cs, start: time.Now(),
		reqID: m.Header.Get(bus.HeaderRequestID), caller: m.Header.Get(bus.HeaderSubject)}

	s.mu.Lock()
	switch {
	case s.detached:
		s.mu.Unlock()
		fail(schemas.CodeNodeOffline, "node session ended", bus.DecisionOffline, call.Tool)
		return
	case s.streamsByID[sid] != "":
		s.mu.Unlock()
		fail(schemas.CodeBadRequest, "stream id already in use", bus.DecisionInvalid, call.Tool)
		return
	case !cs.allow():
		s.mu.Unlock()
		fail(schemas.CodeRateLimited, "capability rate limit exceeded", bus.DecisionRateLimit, call.Tool)
		return
	case cs.cap.Constraints.MaxConcurrency > 0 && cs.streams >= cs.cap.Constraints.MaxConcurrency:
		s.mu.Unlock()
		fail(schemas.CodeRateLimited, "capability stream limit reached", bus.DecisionRateLimit, call.Tool)
		return
	}
	cs.streams++
	if s.streams == nil {
		s.streams, s.streamsByID = map[string]*tierStream{}, map[string]string{}
	}
	s.streams[cmdID] = st
	s.streamsByID[sid] = cmdID
	s.mu.Unlock()

	if err := s.writeRaw(ctx, frame); err != nil {
		s.dropStream(ctx, cmdID, false)
		fail(schemas.CodeNodeOffline, "device connection failed", bus.DecisionOffline, call.Tool)
		return
	}
	s.respond(m.Reply, bus.OKReply([]byte(`{"stream_id":"`+sid+`"}`)))
	s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: st.caller, Tool: call.Tool, NodeID: s.nodeID,
		Decision: bus.DecisionAllowed, RequestID: st.reqID, Duration: time.Since(st.start)})
}

// dropStream forgets a stream; with cancel it also tells the device to stop.
// It returns the stream if it was still open.
func (s *session) dropStream(ctx context.Context, cmdID string, cancel bool) *tierStream {
	s.mu.Lock()
	st := s.streams[cmdID]
	if st != nil {
		delete(s.streams, cmdID)
		delete(s.streamsByID, st.id)
		st.cap.streams--
	}
	s.mu.Unlock()
	if st != nil && cancel {
		if err := s.write(ctx, wire.TypeCancel, cmdID, wire.Cancel{}); err != nil {
			s.t.log.Debug("cancel a stream", "node_id", s.nodeID, "err", err)
		}
	}
	return st
}

// endStream tells the gateway of a stream that it ended, and why.
func (s *session) endStream(st *tierStream, reason string) {
	err := s.t.o.NC.PublishMsg(&nats.Msg{Subject: st.subject, Header: nats.Header{bus.HeaderStreamEnd: {reason}}})
	if err != nil {
		s.t.log.Warn("publish stream end", "node_id", s.nodeID, "err", err)
	}
}

// announceTakeover tells every session of this node, on any tier, that
// this one is the newest.
func (s *session) announceTakeover() {
	err := s.t.o.NC.PublishMsg(&nats.Msg{Subject: bus.NodeCancel(s.nodeID),
		Header: nats.Header{bus.HeaderTakeover: {s.id}}})
	if err != nil {
		s.t.log.Warn("publish takeover", "node_id", s.nodeID, "err", err)
	}
}

// onTakeover handles another session's takeover of this node. Session ids
// are ULIDs: the greater is the newer, and the older one leaves with 4409.
// An older session announcing itself late hears from this one again.
func (s *session) onTakeover(other string) {
	switch {
	case other > s.id:
		s.detach()
		s.t.goFor(s, func() { s.close(wire.CloseReplaced, "", "replaced by a newer session") })
	case other < s.id:
		s.announceTakeover()
	}
}

// onCancel stops the stream whose id the gateway published on the node's
// cancel subject, or handles a takeover.
func (s *session) onCancel(ctx context.Context, m *nats.Msg) {
	s.mu.Lock()
	detached := s.detached
	s.mu.Unlock()
	if detached { // no longer serves the node: neither cancels nor takeovers are its
		return
	}
	if other := m.Header.Get(bus.HeaderTakeover); other != "" {
		s.onTakeover(other)
		return
	}
	s.mu.Lock()
	cmdID := s.streamsByID[string(m.Data)]
	s.mu.Unlock()
	if cmdID != "" {
		s.dropStream(ctx, cmdID, true)
	}
}

// onNoListener handles a "no responders" status for a frame: the gateway
// that held the stream is gone. Frames carry the reply subject
// <tier inbox>.<node id>.<stream id>, served by one tier subscription.
func (t *Tier) onNoListener(m *nats.Msg) {
	if m.Header.Get("Status") != "503" {
		return
	}
	rest := strings.TrimPrefix(m.Subject, t.inbox+".")
	nodeID, sid, ok := strings.Cut(rest, ".")
	if !ok {
		return
	}
	t.mu.Lock()
	s := t.sessions[nodeID]
	t.mu.Unlock()
	if s != nil {
		// It writes to the device: not on the subscription's goroutine.
		t.goFor(s, func() { s.stopStream(context.Background(), sid) })
	}
}

// stopStream stops the stream with id sid, if this session serves it.
func (s *session) stopStream(ctx context.Context, sid string) {
	s.mu.Lock()
	cmdID := s.streamsByID[sid]
	s.mu.Unlock()
	if cmdID != "" {
		s.dropStream(ctx, cmdID, true)
	}
}

// onStream forwards one frame of the device to the stream's subject.
// Frames of streams already stopped are dropped: they race the cancel.
func (s *session) onStream(e wire.Envelope) {
	var f wire.StreamFrame
	if e.InReplyTo == "" || wire.DecodePayload(e, &f) != nil || f.Event != "metric" || len(f.Data) == 0 {
		s.close(wire.CloseMalformed, "", "malformed stream frame")
		return
	}
	s.mu.Lock()
	st := s.streams[e.InReplyTo]
	s.mu.Unlock()
	if st == nil {
		return
	}
	msg := &nats.Msg{Subject: st.subject, Reply: s.t.inbox + "." + s.nodeID + "." + st.id, Data: f.Data,
		Header: nats.Header{bus.HeaderEvent: {f.Event}}}
	if err := s.t.o.NC.PublishMsg(msg); err != nil {
		s.t.log.Warn("publish stream frame", "node_id", s.nodeID, "err", err)
	}
}

// endStreams tells the gateways of every open stream that the device went
// away (the session is ending).
func (s *session) endStreams(reason string) {
	s.mu.Lock()
	streams := s.streams
	s.streams, s.streamsByID = nil, nil
	for _, st := range streams {
		st.cap.streams--
	}
	s.mu.Unlock()
	for _, st := range streams {
		s.endStream(st, reason)
	}
}

// Streams returns the number of streams the tier's sessions serve.
func (t *Tier) Streams() int { return t.sumSessions(func(s *session) int { return len(s.streams) }) }

// sumSessions adds up count over the tier's sessions, each read under
// its own lock (never the tier's and a session's at once).
func (t *Tier) sumSessions(count func(*session) int) int {
	t.mu.Lock()
	all := make([]*session, 0, len(t.all))
	for s := range t.all {
		all = append(all, s)
	}
	t.mu.Unlock()
	n := 0
	for _, s := range all {
		s.mu.Lock()
		n += count(s)
		s.mu.Unlock()
	}
	return n
}
