package tier

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/workers"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// closeGrace bounds a close handshake.
const closeGrace = 2 * time.Second

// maxCloseReason is the longest reason a close frame carries (RFC 6455
// §5.5: a control frame's payload is at most 125 bytes, 2 of them the code).
const maxCloseReason = 123

// errClosed means the session has been closed by the tier; the read loop
// stops without closing again.
var errClosed = errors.New("session closed")

// session is one device connection. Its run goroutine owns the read loop;
// NATS callbacks, timers and the pinger share the pending map under mu.
type session struct {
	t      *Tier
	c      *websocket.Conn
	raw    net.Conn  // under c; dropped when a close handshake stalls
	idle   *idleConn // what c reads, between raw and c; nil: raw
	live   *peer     // when the device was last heard from
	writes *wire.WriteGuard
	id     string
	remote string
	bearer string
	// certNode is the node id of the device's verified certificate ("":
	// none, or one for no node), checked when Options.ClientCerts is set.
	certNode string

	// Set once by run before the session is attached; read-only after.
	// nodeID, tenant, subject and jti are written under mu: the auth
	// deadline may close (and audit) the session while run sets them.
	nodeID, tenant, subject, jti string
	agent                        schemas.Agent
	// mf is the node's manifest, shared with the tier's sessions that
	// announced the same; caps is the session's own state of each of its
	// capabilities, in its order.
	mf   *manifest
	caps []capState
	// bindSeen is the revision of the node's binding as bind read it (0:
	// none), which hold expects; bindRev is the revision hold wrote, which
	// the session's end gives its TTL (0: none, or given already).
	bindSeen, bindRev uint64
	// clockAt and clockMs are when auth_ok went out, on the tier's
	// monotonic and wall clocks; a cmd's deadline_at_ms counts from them.
	clockAt time.Time
	clockMs int64
	// deadlineAt: the device announced it checks deadline_at_ms, so cmds
	// carry it.
	deadlineAt bool
	// trace: the device announced it reads cmds' traceparent.
	trace bool
	// tokenLabels are the labels claim of the device's token; name and
	// labels are the node's as settled at announce ([session.settle]).
	tokenLabels map[string]string
	name        string
	labels      map[string]string

	closeOnce sync.Once
	done      chan struct{} // closed by close
	// onDone, when set, runs (on its own goroutine) as soon as close
	// begins: it takes the node offline without waiting for the close
	// handshake.
	onDone func()

	// queue holds the calls NATS delivered for the node, served one at a
	// time and in order by a worker while it is not empty.
	qmu       sync.Mutex
	queue     []*nats.Msg
	draining  bool
	announced chan struct{} // closed once announce_ok is written: cmds may follow

	// pending, streams and streamsByID are made by their first entry: most
	// sessions are idle most of the time, and a tier holds tens of
	// thousands.
	mu       sync.Mutex
	pending  map[string]*pendingCall
	sub      *nats.Subscription // the node's cmd subject
	detached bool
	// replaced: the session closed with 4409; the newer session writes
	// the node's record, this one no longer does.
	replaced    bool
	keeper      *keeper                // once the node's record is written
	recheck     bool                   // the record changed before keeper was set
	streams     map[string]*tierStream // by cmd msg_id
	streamsByID map[string]string      // stream id -> cmd msg_id
}

// capState is a session's state of one of its capabilities, under
// session.mu.
type capState struct {
	*capEntry               // the shared manifest's
	limiter   *rate.Limiter // made by the first call (until then it would be full anyway); nil: none yet
	inflight  int           // unary calls in flight
	streams   int           // open streams; limited apart
}

// allow takes a call from the capability's rate limit, if it has one;
// session.mu is held.
func (cs *capState) allow() bool {
	rps := cs.cap.Constraints.RateLimitRPS
	if rps <= 0 {
		return true
	}
	if cs.limiter == nil {
		cs.limiter = rate.NewLimiter(rate.Limit(rps), int(math.Ceil(rps)))
	}
	return cs.limiter.Allow()
}

// capState returns the session's state of its capability capID, or nil.
func (s *session) capState(capID string) *capState {
	for i := range s.caps {
		if s.caps[i].cap.CapID == capID {
			return &s.caps[i]
		}
	}
	return nil
}

type pendingCall struct {
	reply     string
	cap       *capState
	tool      string
	timer     *time.Timer
	start     time.Time
	requestID string
	subject   string
	queryHash string // a local tool's (bus.AuditEvent.QueryHash)
	span      *tracing.Span
}

// offered are the protocol features the tier offers in auth_ok.
var offered = []string{wire.FeatureDeadlineAt, wire.FeatureLabels, wire.FeatureLocalTools, wire.FeatureTrace}

func newSession(t *Tier, c *websocket.Conn, live *peer, r *http.Request) *session {
	s := &session{
		t:         t,
		c:         c,
		live:      live,
		id:        wire.NewMsgID(),
		remote:    r.RemoteAddr,
		done:      make(chan struct{}),
		announced: make(chan struct{}),
	}
	s.writes = wire.NewWriteGuard(t.o.WriteTimeout, func() {
		// The device stopped reading: its writes fail, and so its session.
		t.log.Info("device stalled a write: connection dropped", "session", s.id, "err", c.CloseNow())
	})
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		s.certNode = schemas.CertNodeID(r.TLS.VerifiedChains[0][0])
	}
	if f := strings.Fields(r.Header.Get("Authorization")); len(f) == 2 && strings.EqualFold(f[0], "bearer") {
		s.bearer = f[1]
	}
	return s
}

// errorCodeFor names the error envelope code sent before a close.
func errorCodeFor(closeCode int) string {
	switch closeCode {
	case wire.CloseMalformed, wire.CloseTooLarge:
		return schemas.CodeBadRequest
	case wire.CloseAuthFailed, wire.CloseForbidden:
		return schemas.CodeSafetyDenied
	case wire.CloseTooMany:
		return schemas.CodeRateLimited
	case wire.CloseLiveness:
		return schemas.CodeDeadlineExceeded
	}
	return ""
}

// close sends an error frame (when code is not a normal close) and closes
// the socket with code. It is idempotent and may block until the peer
// answers the close or the close times out, so callers on another
// session's path run it through [Tier.goFor]. It takes no context: a
// close must happen whatever became of whoever asked for it, and every
// step of it is bounded (the error frame by a second, the handshake by
// closeGrace).
func (s *session) close(code int, errCode, reason string) {
	s.closeOnce.Do(func() {
		close(s.done)
		s.t.metrics.closed(code)
		s.mu.Lock()
		s.replaced = code == wire.CloseReplaced
		onDone := s.onDone
		s.mu.Unlock()
		if onDone != nil {
			s.t.goFor(s, onDone)
		}
		if errCode == "" {
			errCode = errorCodeFor(code)
		}
		if errCode != "" {
			b, err := wire.Encode(wire.TypeError, "", wire.ErrorFrame{Code: errCode, Message: reason})
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err = s.c.Write(ctx, websocket.MessageText, b)
				cancel()
			}
			if err != nil {
				s.t.log.Debug("error frame before a close", "session", s.id, "code", errCode, "err", err)
			}
		}
		if code != wire.CloseNormal && code != wire.CloseGoingAway && code != wire.CloseReplaced {
			s.mu.Lock()
			e := bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
				Decision: bus.DecisionProtocol, Code: strconv.Itoa(code)}
			s.mu.Unlock()
			s.t.audit(e)
		}
		// Close waits for the peer's close and reads the rest of a frame
		// left half-read; a peer that stalls must not pin the session.
		force := time.AfterFunc(closeGrace, s.drop)
		// A close frame's reason is at most 123 bytes, or the close is
		// not sent at all; the error frame above carried all of it.
		if len(reason) > maxCloseReason {
			reason = reason[:maxCloseReason]
		}
		if err := s.c.Close(websocket.StatusCode(code), reason); err != nil {
			s.t.log.Debug("close device connection", "session", s.id, "code", code, "err", err)
		}
		force.Stop()
	})
}

// drop closes the connection under the WebSocket library, so that a close
// handshake in progress (which reads the rest of a frame left half-read,
// with no deadline), a read or a write fails at once.
func (s *session) drop() {
	if s.raw == nil {
		return
	}
	if err := s.raw.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		s.t.log.Debug("drop device connection", "session", s.id, "err", err)
	}
}

func (s *session) closed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *session) write(ctx context.Context, typ, inReplyTo string, payload any) error {
	b, err := wire.Encode(typ, inReplyTo, payload)
	if err != nil {
		return err
	}
	return s.writeRaw(ctx, b)
}

// writeRaw writes one frame; a write that stalls for WriteTimeout closes
// the connection, and so does the session's close. The library gets no
// context that can end: with one, it registers a context.AfterFunc for
// every frame it writes, four allocations a call.
func (s *session) writeRaw(_ context.Context, b []byte) error {
	s.writes.Begin()
	err := s.c.Write(context.Background(), websocket.MessageText, b)
	s.writes.End(err == nil)
	return err
}

// read returns the next envelope. On a protocol violation it closes the
// session with the matching code and returns errClosed. With yield, it
// returns errIdle when the device has sent no whole message, only
// control frames (see [idleConn]).
func (s *session) read(ctx context.Context, yield bool) (wire.Envelope, error) {
	if yield {
		s.idle.setYield(true)
	}
	typ, r, err := s.c.Reader(ctx)
	if yield {
		// The message's own frames are read through.
		s.idle.setYield(false)
	}
	if err != nil {
		return wire.Envelope{}, err
	}
	s.t.live.hear(s.live)
	if typ != websocket.MessageText {
		s.close(wire.CloseMalformed, "", "binary frames are not allowed")
		return wire.Envelope{}, errClosed
	}
	max := s.t.o.MaxFrameBytes
	b, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
	if err != nil {
		return wire.Envelope{}, err
	}
	if len(b) > max {
		s.close(wire.CloseTooLarge, "", "frame larger than "+strconv.Itoa(max)+" bytes")
		return wire.Envelope{}, errClosed
	}
	e, err := wire.DecodeEnvelope(s.t.o.Schemas, b)
	if err != nil {
		s.close(wire.CloseMalformed, "", "malformed envelope")
		return wire.Envelope{}, errClosed
	}
	return e, nil
}

// expect reads the next envelope and requires its type.
func (s *session) expect(ctx context.Context, typ string) (wire.Envelope, error) {
	e, err := s.read(ctx, false)
	if err != nil {
		return e, err
	}
	if e.Type != typ {
		s.close(wire.CloseMalformed, "", "expected "+typ)
		return e, errClosed
	}
	return e, nil
}

// run runs the session's handshake, and returns its read loop, to be run
// on a goroutine of its own, or nil once the session has ended. The
// handshake grows a goroutine's stack far beyond what an idle session
// needs (see [idleConn]); the collector would shrink it by half a cycle,
// and an idle tier collects seldom.
func (s *session) run(ctx context.Context) (serve func()) {
	ended := true
	defer func() {
		if ended {
			s.cleanup()
		}
	}()
	release := func() func() {
		defer s.t.endHandshake() // taken in Tier.serveWS
		return s.start(ctx)
	}()
	if release == nil {
		return nil
	}
	ended = false
	return func() {
		defer s.cleanup()
		defer release()                         // waits for a release in progress
		defer s.close(wire.CloseNormal, "", "") // when the read loop ends first
		s.serve(ctx)
	}
}

// start runs the handshake (hello, auth, announce) and takes the node;
// it returns what takes the node offline again, or nil when the session
// must end.
func (s *session) start(ctx context.Context) (release func()) {
	// Late is not refused: E_DEADLINE_EXCEEDED in the error frame tells
	// the device that another try may be on time.
	lateClose := func() { s.close(wire.CloseAuthFailed, schemas.CodeDeadlineExceeded, "authentication timeout") }
	deadline := time.AfterFunc(s.t.o.AuthTimeout, func() { s.t.goFor(s, lateClose) })
	defer deadline.Stop()

	err := s.write(ctx, wire.TypeHello, "", wire.Hello{
		Proto:          wire.Subprotocol,
		AuthDeadlineMs: int(s.t.o.AuthTimeout / time.Millisecond),
		MaxFrameBytes:  s.t.o.MaxFrameBytes,
	})
	if err != nil {
		return nil
	}
	if s.c.Subprotocol() != wire.Subprotocol {
		s.close(wire.CloseMalformed, "", "subprotocol okso.v1 required")
		return nil
	}
	if !s.authenticate(ctx) {
		return nil
	}
	if !deadline.Stop() {
		// The deadline fired while we verified. Its close may not have
		// begun yet: begin it here, or the session's end would close first,
		// with 1000.
		lateClose()
		return nil
	}
	// Whose node id this is, asked of JetStream, is the tier's time, not
	// the device's, and must not end in a 4401.
	if !s.bind(ctx) {
		return nil
	}
	s.clockAt = time.Now()
	s.clockMs = s.clockAt.UnixMilli()
	if s.write(ctx, wire.TypeAuthOK, "", wire.AuthOK{NodeID: s.nodeID, Tenant: s.tenant, SessionID: s.id,
		ServerTimeMs: s.clockMs, Features: offered}) != nil {
		return nil
	}
	deadline.Reset(s.t.o.AuthTimeout)
	lease := s.announce(ctx, deadline, lateClose)
	if lease == nil {
		return nil
	}
	deadline.Stop()

	// The node goes offline as soon as the session starts closing, not
	// after the close handshake (up to closeGrace with a silent peer).
	k := s.keepAlive(lease)
	var once sync.Once
	release = func() { once.Do(func() { releaseLease(s, k.stop()) }) }
	s.mu.Lock()
	s.onDone = release
	s.mu.Unlock()
	if s.closed() { // closed before onDone was set: close did not see it
		s.t.goFor(s, release)
	}
	return release
}

// serve reads the device's frames until the connection ends or a frame
// breaks the protocol.
//
// When the connection allows ([idleConn]), the session's goroutine only
// waits for the device, in [idleConn.wait], and has each message read
// and handled by one of the tier's workers, waiting for it: what its
// stack then holds is a few small frames, so it stays at 4 KiB
// (BenchmarkSessionMemory) for as long as the device is connected. Read
// on its own goroutine, a mere pong (every ping interval of an idle
// device) took the stack past 4 KiB, through the library's reader and its
// error wrapping, and 8 KiB it stayed until a collection.
func (s *session) serve(ctx context.Context) {
	if s.idle == nil {
		for s.step(ctx, false) {
		}
		return
	}
	stepped := make(chan bool, 1)
	step := func() {
		more := false
		defer func() {
			// Not net/http's goroutine nor the session's: a panic here is
			// recovered as theirs are (see [Tier.runSession]).
			if r := recover(); r != nil {
				s.t.log.Error("device session panicked", "node_id", s.nodeID, "panic", r, "stack", string(debug.Stack()))
				s.close(wire.CloseGoingAway, schemas.CodeInternal, "tier error")
			}
			stepped <- more
		}()
		more = s.step(ctx, true)
	}
	for s.idle.wait() == nil {
		s.t.steps.Run(step)
		if !<-stepped {
			return
		}
	}
}

// step reads the device's next message and handles it; it reports
// whether the session goes on. With yield it goes on with the messages
// after it, until errIdle says that nothing is left, not even in the
// library's buffer (the connection is read only when that is empty):
// only then may the session wait on the connection ([idleConn.wait]).
func (s *session) step(ctx context.Context, yield bool) bool {
	for {
		e, err := s.read(ctx, yield)
		if errors.Is(err, errIdle) {
			return true
		}
		if err != nil {
			return false
		}
		switch e.Type {
		case wire.TypeCmdAck:
			s.onAck(ctx, e)
			// Let the reply go on its way over NATS before this goroutine
			// reads on: on one P it would otherwise try the socket (a
			// syscall, then a park) while the reply waits.
			runtime.Gosched()
		case wire.TypeStream:
			s.onStream(e)
		default:
			s.close(wire.CloseMalformed, "", "unexpected "+e.Type+" frame")
			return false
		}
		if !yield {
			return true
		}
	}
}

func (s *session) authenticate(ctx context.Context) bool {
	token := s.bearer
	if token == "" {
		e, err := s.expect(ctx, wire.TypeAuth)
		if err != nil {
			return false
		}
		var a wire.Auth
		if err := wire.DecodePayload(e, &a); err != nil || a.Token == "" {
			s.close(wire.CloseMalformed, "", "malformed auth payload")
			return false
		}
		token = a.Token
	}
	claims, err := s.t.o.Verifier.Verify(token)
	if err != nil {
		s.close(wire.CloseAuthFailed, "", "authentication failed")
		return false
	}
	s.mu.Lock()
	s.tenant, s.subject, s.jti = claims.Tenant, claims.Subject, claims.ID
	s.mu.Unlock()
	if r := s.t.o.Revoked; r != nil && r.Revoked(claims.ID) {
		s.t.audit(bus.AuditEvent{Tenant: claims.Tenant, Subject: claims.Subject, JTI: claims.ID,
			Decision: bus.DecisionRevoked, Code: schemas.CodeSafetyDenied})
		s.close(wire.CloseAuthFailed, "", "token revoked")
		return false
	}
	if !claims.HasScope(auth.ScopeDeviceConnect) {
		s.close(wire.CloseForbidden, "", "token lacks scope device:connect")
		return false
	}
	if !schemas.ValidNodeID(claims.Subject) {
		s.close(wire.CloseForbidden, "", "token subject is not a node id")
		return false
	}
	if err := schemas.CheckLabels(claims.Labels); err != nil {
		s.close(wire.CloseForbidden, "", "token labels claim: "+err.Error())
		return false
	}
	s.tokenLabels = claims.Labels
	s.bearer = "" // the token is verified: nothing else needs it
	s.mu.Lock()
	s.nodeID = claims.Subject
	s.mu.Unlock()
	if s.t.o.ClientCerts && s.certNode != claims.Subject {
		// Before bind: a token that is not the certificate's must not
		// claim its node id for its tenant.
		s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
			Decision: bus.DecisionDenied, Code: schemas.CodeSafetyDenied})
		s.t.log.Warn("refused a device token for another node than its certificate's", "node_id", s.nodeID,
			"tenant", s.tenant, "cert_node_id", s.certNode, "remote", s.remote)
		s.close(wire.CloseForbidden, "", "token node id differs from the client certificate's")
		return false
	}
	return true
}

// bind makes sure the node id is its tenant's, and refuses the session
// (4403) when another tenant holds it. A free node id it binds at once,
// so that of two tenants presenting it only one gets auth_ok; one its
// tenant holds already it leaves to hold, once the session is about to
// take the node.
func (s *session) bind(ctx context.Context) bool {
	var owner string
	err := s.untilJetStream(ctx, func(ctx context.Context) (err error) {
		owner, s.bindSeen, err = s.t.o.Bindings.Check(ctx, s.nodeID, s.tenant)
		return err
	}, bus.ErrOtherTenant)
	if err == nil && s.bindSeen == 0 {
		// No session holds a node id that has no binding (theirs has no
		// TTL): none can be given one by this session's end.
		return s.hold(ctx)
	}
	return s.bound(owner, err)
}

// hold writes the node's binding to its tenant, with no TTL while the
// session holds the node: just before the session takes the node's
// subject and record, so that little can end it between the two. A
// session that wrote the binding and then ended without taking the node
// would give it its TTL while an older session of the node, whose
// release no longer matches the binding, holds it.
func (s *session) hold(ctx context.Context) bool {
	if s.bindRev != 0 {
		return true // bound already, when the node id was free
	}
	var owner string
	var rev uint64
	err := s.untilJetStream(ctx, func(ctx context.Context) (err error) {
		owner, rev, err = s.t.o.Bindings.Hold(ctx, s.nodeID, s.tenant, s.bindSeen)
		return err
	}, bus.ErrOtherTenant)
	if err == nil {
		s.mu.Lock()
		s.bindRev = rev
		s.mu.Unlock()
	}
	return s.bound(owner, err)
}

// bound ends the session on a failed bind or hold.
func (s *session) bound(owner string, err error) bool {
	switch {
	case errors.Is(err, bus.ErrOtherTenant):
		s.refuseOtherTenant(owner)
		return false
	case err != nil:
		s.t.log.Error("bind node id to its tenant", "node_id", s.nodeID, "err", err)
		s.close(wire.CloseGoingAway, schemas.CodeInternal, "tier cannot read the node bindings")
		return false
	}
	return true
}

// releaseBinding gives the node's binding its TTL, once, if the session
// wrote it and was not replaced: a newer session has written its own
// revision, which a release of this one's would not match anyway.
func (s *session) releaseBinding() {
	s.mu.Lock()
	rev, replaced := s.bindRev, s.replaced
	s.bindRev = 0
	s.mu.Unlock()
	if rev == 0 || replaced {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.t.o.Bindings.Release(ctx, s.nodeID, s.tenant, rev); err != nil {
		s.t.log.Warn("release node binding", "node_id", s.nodeID, "err", err)
	}
}

// refuseOtherTenant closes a session whose node id another tenant holds,
// with 4403. The refused tenant's audit says so without naming the owner;
// the owner's says that its node id was presented, without naming who
// presented it. Only the tier's log, the operator's, names both.
func (s *session) refuseOtherTenant(owner string) {
	s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
		Decision: bus.DecisionDenied, Code: schemas.CodeSafetyDenied})
	if owner != s.tenant && schemas.ValidTenant(owner) {
		s.t.audit(bus.AuditEvent{Tenant: owner, NodeID: s.nodeID, Decision: bus.DecisionDenied,
			Code: schemas.CodeSafetyDenied})
	}
	s.t.log.Warn("refused a node id bound to another tenant", "node_id", s.nodeID, "tenant", s.tenant,
		"owner", owner)
	s.close(wire.CloseForbidden, "", "node id belongs to another tenant")
}

// announce reads and checks the manifest, takes the node's subject and
// registry record, and confirms to the device. It returns the record's
// lease, or nil when the session must end.
func (s *session) announce(ctx context.Context, deadline *time.Timer, lateClose func()) *bus.Lease {
	e, err := s.expect(ctx, wire.TypeAnnounce)
	if err != nil {
		return nil
	}
	// The device was on time: what follows (subscribing, and the registry
	// claim, retried through a JetStream election) is the tier's time, not
	// the device's, and must not end in a 4401.
	if !deadline.Stop() {
		lateClose() // the deadline fired as the announce came in
		return nil
	}
	// A cheap count first: the schema allows few capabilities, and a huge
	// manifest (under a raised frame limit) should not cost a full check.
	var count struct {
		Capabilities []json.RawMessage `json:"capabilities"`
	}
	if json.Unmarshal(e.Payload, &count) != nil || len(count.Capabilities) > schemas.MaxCapabilities {
		s.close(wire.CloseMalformed, schemas.CodeManifestInvalid, "announce fails the manifest schema")
		return nil
	}
	if err := s.t.o.Schemas.ValidateJSON(schemas.Manifest, e.Payload); err != nil {
		msg := labelsRefusal(e.Payload)
		if msg == "" {
			msg = "announce fails the manifest schema"
		}
		s.close(wire.CloseMalformed, schemas.CodeManifestInvalid, msg)
		return nil
	}
	var a wire.Announce
	if err := wire.DecodePayload(e, &a); err != nil {
		s.close(wire.CloseMalformed, schemas.CodeManifestInvalid, "announce fails the manifest schema")
		return nil
	}
	if msg := checkAnnounceLabels(&a); msg != "" {
		s.close(wire.CloseMalformed, schemas.CodeManifestInvalid, msg)
		return nil
	}
	if a.NodeID != s.nodeID {
		s.close(wire.CloseForbidden, "", "announced node_id differs from the token subject")
		return nil
	}
	var kinds *schemas.KindTable
	if s.t.o.Kinds != nil {
		kinds = s.t.o.Kinds()
	}
	tools, mf, msg := project(kinds, s.nodeID, a.Capabilities)
	if msg != "" {
		s.close(wire.CloseMalformed, schemas.CodeManifestInvalid, msg)
		return nil
	}
	s.mf = s.t.manifests.share(mf) // released by cleanup
	s.caps, s.agent = s.mf.states(), a.Agent
	s.deadlineAt = slices.Contains(a.Features, wire.FeatureDeadlineAt)
	s.trace = slices.Contains(a.Features, wire.FeatureTrace)
	s.name, s.labels = s.settle(&a)
	s.tokenLabels = nil // settled
	if !s.t.admitTools(s, len(tools)) {
		s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
			Decision: bus.DecisionDenied, Code: schemas.CodeSafetyDenied})
		s.close(wire.CloseForbidden, "", "the tenant's tool cap of "+strconv.Itoa(s.t.o.MaxToolsPerTenant)+" tools is reached")
		return nil
	}

	if !s.hold(ctx) {
		return nil
	}
	if !s.t.attach(s) {
		s.close(wire.CloseGoingAway, "", "tier shutting down")
		return nil
	}
	// The node's cancel subject is served by the tier's one subscription
	// to every node's (see [Tier.onCancel]).
	// Calls come in on the tier's shared channel (see [Tier.dispatch]).
	sub, err := s.t.o.NC.ChanQueueSubscribe(bus.NodeCmd(s.nodeID), bus.QueueNode, s.t.cmds)
	if err == nil {
		err = s.t.o.NC.FlushTimeout(5 * time.Second)
	}
	if err != nil {
		s.t.log.Error("subscribe node subject", "node_id", s.nodeID, "err", err)
		s.close(wire.CloseGoingAway, schemas.CodeInternal, "tier cannot reach NATS")
		return nil
	}
	s.mu.Lock()
	if s.detached { // replaced while subscribing
		s.mu.Unlock()
		if err := sub.Unsubscribe(); err != nil {
			s.t.log.Warn("unsubscribe node subject", "node_id", s.nodeID, "err", err)
		}
		return nil
	}
	s.sub = sub
	s.mu.Unlock()

	// Online only once the subject is served: claim after the flush.
	lease, err := s.claim(ctx)
	if errors.Is(err, bus.ErrLeaseLost) {
		s.close(wire.CloseReplaced, "", "registry record taken by a newer session")
		return nil
	}
	if err != nil {
		s.t.log.Error("claim registry record", "node_id", s.nodeID, "err", err)
		s.close(wire.CloseGoingAway, schemas.CodeInternal, "tier cannot write the registry")
		return nil
	}
	// Older sessions of this node on other tier replicas close with 4409.
	s.announceTakeover()
	if err := s.write(ctx, wire.TypeAnnounceOK, e.MsgID, wire.AnnounceOK{Tools: tools}); err != nil {
		releaseLease(s, lease)
		return nil
	}
	close(s.announced)
	s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
		Decision: bus.DecisionConnected})
	return lease
}

// project checks a manifest beyond its schema ([schemas.KindTable.Project],
// with the tier's kind table: kinds nil, the built-in kinds alone) and
// returns the projected tool names and the manifest; it also swaps the
// closed-set strings of caps (kind, safety class, schema_ref, verbs) for
// the kind table's. A non-empty msg explains the refusal.
func project(kinds *schemas.KindTable, nodeID string, caps []schemas.Capability) (tools []string, mf *manifest, msg string) {
	projected, err := kinds.Project(nodeID, caps)
	if err != nil {
		return nil, nil, err.Error()
	}
	tools = make([]string, 0, len(projected))
	var last *schemas.Capability
	for _, t := range projected {
		tools = append(tools, t.Name)
		c := t.Cap
		if c == last {
			continue // a capability's next verb
		}
		last = c
		// The strings of a closed set are kept as the table's own, not as
		// each session's decoded copies.
		c.Kind, c.SafetyClass = t.Kind.Name, internSafety(c.SafetyClass)
		if c.Description != "" {
			// A fleet that shares one tools file shares its texts.
			c.Description = unique.Make(c.Description).Value()
		}
		if v, ok := t.Kind.VerbByInput(c.SchemaRef); ok {
			c.SchemaRef = v.Input
		}
		for j, v := range c.Verbs {
			if kv, ok := t.Kind.Verb(v); ok {
				c.Verbs[j] = kv.Name
			}
		}
	}
	return tools, newManifest(caps, projected), ""
}

// internSafety returns the package constant equal to a safety class.
func internSafety(class string) string {
	for _, c := range []string{schemas.SafetyReadOnly, schemas.SafetyMutating, schemas.SafetyDestructive} {
		if class == c {
			return c
		}
	}
	return class
}

// keeper is the session as the tier's [liveness] sees it, and writes the
// node's record again when it is no longer the session's (reassert), on
// timers rather than a goroutine of its own (a tier holds tens of
// thousands of sessions, and each parked goroutine costs its stack).
// Nothing is refreshed: the node's record lives as long as the tier's
// lease ([Tier.holdLease]), its binding has no TTL until the session
// ends ([bus.Bindings]).
type keeper struct {
	s       *session
	mu      sync.Mutex // held by a reassert in progress
	lease   *bus.Lease // the lease a reassert may re-claim
	stopped bool
	// retry writes the record again after a failed reassert, again later
	// than the last.
	retry *time.Timer
	again time.Duration
}

// keepAlive starts watching the device's liveness, until stop.
func (s *session) keepAlive(lease *bus.Lease) *keeper {
	k := &keeper{s: s, lease: lease}
	k.mu.Lock()
	defer k.mu.Unlock()
	s.t.live.add(s.live, k)
	s.mu.Lock()
	s.keeper = k
	recheck := s.recheck
	s.mu.Unlock()
	if recheck { // the record changed between the claim and now
		s.t.goFor(s, func() {
			ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
			defer cancel()
			k.reassert(ctx)
		})
	}
	return k
}

// stop ends the timers and the liveness watch, waits for a reassert in
// progress, and returns the lease as it now is (a reassert may have
// claimed it again).
func (k *keeper) stop() *bus.Lease {
	k.mu.Lock()
	k.stopped = true
	if k.retry != nil {
		k.retry.Stop()
	}
	lease := k.lease
	k.mu.Unlock()
	k.s.t.live.remove(k.s.live)
	return lease
}

// refreshTimeout bounds the JetStream work of one write of the tier's
// lease, or of a node's record again.
const refreshTimeout = 10 * time.Second

// reassert writes the node's record again if it is no longer the one
// the session wrote: after the tier's lease lapsed (another tier may have
// marked it offline meanwhile, and given the node's binding its TTL), or
// when another write took its place; it writes the binding again first,
// with no TTL. A newer session's record ends this session with 4409.
func (k *keeper) reassert(ctx context.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.s
	if k.stopped || s.closed() {
		return
	}
	current, err := k.lease.Current(ctx)
	if err == nil && !current {
		err = s.rehold(ctx)
		switch {
		case errors.Is(err, bus.ErrLeaseLost):
			s.close(wire.CloseReplaced, "", "node binding taken by a newer session")
			return
		case errors.Is(err, bus.ErrOtherTenant):
			return // refused
		}
	}
	if err == nil && !current {
		var l *bus.Lease
		l, err = s.t.lease.Claim(ctx, s.record())
		if errors.Is(err, bus.ErrLeaseLost) {
			s.close(wire.CloseReplaced, "", "registry record taken by a newer session")
			return
		}
		if l != nil {
			k.lease = l
		}
	}
	if err != nil {
		// Nothing else would write it (no refresh is periodic): try again
		// a little later each time, until it is written or the session ends.
		k.again = min(max(2*k.again, time.Second), s.t.o.Registry.TTL())
		s.t.log.Warn("write registry record again", "node_id", s.nodeID, "err", err, "again_in", k.again)
		if k.retry == nil {
			k.retry = time.AfterFunc(k.again, func() {
				ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
				defer cancel()
				k.reassert(ctx)
			})
		} else {
			k.retry.Reset(k.again)
		}
		return
	}
	k.again = 0
}

// rehold writes the node's binding again, with no TTL, for a session
// whose record is to be written again ([bus.Bindings.Rehold]): a sweep
// may have given the binding its TTL. On another tenant's binding (an
// operator freed the node id, and another tenant took it) it ends the
// session with 4403 and returns bus.ErrOtherTenant; on a newer session's,
// bus.ErrLeaseLost.
func (s *session) rehold(ctx context.Context) error {
	s.mu.Lock()
	rev := s.bindRev
	s.mu.Unlock()
	owner, rev, err := s.t.o.Bindings.Rehold(ctx, s.nodeID, s.tenant, rev)
	if errors.Is(err, bus.ErrOtherTenant) {
		s.refuseOtherTenant(owner)
		return err
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.bindRev = rev
	s.mu.Unlock()
	return nil
}

// ping pings the device, on a goroutine of the session's: the library's
// Ping waits for the pong, which ends it (the pong itself counts as
// liveness through the read loop), or for the connection's close, which
// liveness brings about if the pong never comes.
func (k *keeper) ping() {
	s := k.s
	s.t.goFor(s, func() {
		if err := s.c.Ping(context.Background()); err != nil {
			s.t.log.Debug("ping device", "session", s.id, "err", err)
		}
	})
}

// lost closes the session of a device that answered no ping.
func (k *keeper) lost() {
	s := k.s
	s.t.goFor(s, func() { s.close(wire.CloseLiveness, "", "device missed a ping") })
}

// leaseWait bounds how long a session waits for its tier to take its
// lease (the tier's first write to NATS) before it sends its device away.
const leaseWait = 10 * time.Second

// claim writes the node's record, under the tier's lease once the tier
// holds it. It returns bus.ErrLeaseLost when a newer session holds the
// node.
func (s *session) claim(ctx context.Context) (lease *bus.Lease, err error) {
	wait := time.NewTimer(leaseWait)
	defer wait.Stop()
	select {
	case <-s.t.leased:
	case <-wait.C:
		return nil, fmt.Errorf("the tier holds no lease yet (NATS away?) after %v", leaseWait)
	case <-s.done:
		return nil, errors.New("session ended before the tier held its lease")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	claim := s.t.lease.Claim
	if s.bindSeen == 0 {
		// A node id that had no binding has seldom a record: its binding
		// expires with the record of its last session, or never existed.
		claim = s.t.lease.ClaimNew
	}
	err = s.untilJetStream(ctx, func(ctx context.Context) (err error) {
		lease, err = claim(ctx, s.record())
		return err
	}, bus.ErrLeaseLost)
	return lease, err
}

// untilJetStream runs op until it succeeds or fails with final. While a
// NATS cluster elects a new JetStream leader (a member just died) reads
// and writes fail for a few seconds: it tries again for up to 8 s rather
// than send the device away.
func (s *session) untilJetStream(ctx context.Context, op func(context.Context) error, final error) error {
	deadline := time.Now().Add(8 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := op(cctx)
		cancel()
		if err == nil || (final != nil && errors.Is(err, final)) || time.Now().After(deadline) || s.closed() {
			return err
		}
		select {
		case <-s.done:
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// releaseLease takes the node offline in the reverse order of announce:
// first the session stops serving the node's subject (and NATS has the
// unsubscribe), then the registry record is marked offline, revision
// checked. A caller who sees the record go offline thus never reaches the
// dead session. A replaced session (4409) writes nothing: the newer
// session may not have claimed the node yet, and a record marked offline
// meanwhile would take a live node out of every gateway for a moment.
func releaseLease(s *session, lease *bus.Lease) {
	s.detach()
	if err := s.t.o.NC.FlushTimeout(5 * time.Second); err != nil {
		s.t.log.Warn("flush unsubscribe", "node_id", s.nodeID, "err", err)
	}
	s.mu.Lock()
	replaced := s.replaced
	s.mu.Unlock()
	if replaced {
		return
	}
	// The binding first: if the tier dies before the record is marked
	// offline, its sweep gives the binding its TTL; a record marked offline
	// first would be swept no more.
	s.releaseBinding()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := lease.Leave(ctx, time.Now()); err != nil {
		s.t.log.Warn("mark registry record offline", "node_id", s.nodeID, "err", err)
	}
}

func (s *session) record() bus.Node {
	s.mu.Lock()
	rev := s.bindRev
	s.mu.Unlock()
	return bus.Node{
		NodeID:       s.nodeID,
		Tenant:       s.tenant,
		SessionID:    s.id,
		Tier:         s.t.o.Name,
		Agent:        s.agent,
		Capabilities: s.mf.caps,
		ConnectedAt:  time.Now().UTC(),
		Name:         s.name,
		Labels:       s.labels,
		BindingRev:   rev,
	}
}

// detach stops s serving its node's subject, because a newer session took
// the node. Pending calls still complete or fail.
func (s *session) detach() {
	s.mu.Lock()
	s.detached = true
	sub := s.sub
	s.sub = nil
	s.mu.Unlock()
	if sub != nil {
		// Drain, not Unsubscribe: requests already queued on the
		// subscription still reach onCall, which answers them
		// E_NODE_OFFLINE instead of leaving the caller to its deadline.
		if err := sub.Drain(); err != nil {
			s.t.log.Warn("drain node subject", "session", s.id, "err", err)
		}
	}
}

func (s *session) cleanup() {
	s.close(wire.CloseNormal, "", "")
	s.detach()
	s.mu.Lock()
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, p := range pending {
		p.timer.Stop()
		s.finish(p, bus.ErrorReply(schemas.CodeNodeOffline, "device disconnected during the call"),
			bus.DecisionOffline, schemas.CodeNodeOffline)
	}
	s.endStreams(bus.ReasonDeviceOffline)
	s.releaseBinding() // a session that wrote its binding but never took the node
	s.t.release(s)
	if s.t.tools != nil && s.nodeID != "" {
		s.t.tools.release(s.id, s.nodeID)
	}
	s.t.manifests.release(s.mf)
	if s.nodeID != "" && s.caps != nil {
		s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
			Decision: bus.DecisionDisconnect})
	}
}

// enqueue queues a call for the session; calls to one node are served in
// the order NATS delivered them, by one worker at a time, whose writes to
// the device take ctx. It reports false when the node already has max
// calls queued.
func (s *session) enqueue(ctx context.Context, m *nats.Msg, w *workers.Pool, max int) bool {
	s.qmu.Lock()
	if len(s.queue) >= max {
		s.qmu.Unlock()
		return false
	}
	s.queue = append(s.queue, m)
	start := !s.draining
	s.draining = true
	s.qmu.Unlock()
	if start {
		w.Run(func() { s.drain(ctx) })
	}
	return true
}

// drain serves the queued calls until none is left.
func (s *session) drain(ctx context.Context) {
	for {
		s.qmu.Lock()
		if len(s.queue) == 0 {
			s.queue, s.draining = nil, false // an idle session keeps no array
			s.qmu.Unlock()
			return
		}
		m := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.qmu.Unlock()
		s.onCall(ctx, m)
	}
}

// onCall serves one request on the node's subject.
func (s *session) onCall(ctx context.Context, m *nats.Msg) {
	// The subject is served, and the record written, just before
	// announce_ok goes out: a call that comes in between waits for it, so
	// a device never gets a cmd before its announce_ok.
	select {
	case <-s.announced:
	case <-s.done:
		s.respond(m.Reply, bus.ErrorReply(schemas.CodeNodeOffline, "node session ended"))
		return
	}
	if m.Header.Get(bus.HeaderProbe) != "" {
		s.respond(m.Reply, bus.OKReply([]byte("{}")))
		return
	}
	start := time.Now()
	reqID := m.Header.Get(bus.HeaderRequestID)
	fail := func(code, msg, decision, tool string) {
		s.respond(m.Reply, bus.ErrorReply(code, msg))
		s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: m.Header.Get(bus.HeaderSubject), Tool: tool,
			NodeID: s.nodeID, Decision: decision, Code: code, Duration: time.Since(start), RequestID: reqID})
	}
	call, err := bus.DecodeCall(m.Data)
	if err != nil {
		fail(schemas.CodeBadRequest, "malformed call", bus.DecisionInvalid, "")
		return
	}
	name, ok := schemas.ParseToolName(call.Tool)
	if !ok || name.NodeID != s.nodeID {
		fail(schemas.CodeToolNotFound, "no such tool on this node", bus.DecisionNotFound, "")
		return
	}
	cs := s.capState(name.CapID)
	if cs == nil || cs.kind.Short != name.KindShort || !containsVerb(cs.cap.Verbs, name.Verb) {
		fail(schemas.CodeToolNotFound, "no such tool on this node", bus.DecisionNotFound, call.Tool)
		return
	}
	if m.Header.Get(bus.HeaderTenant) != s.tenant {
		fail(schemas.CodeSafetyDenied, "node belongs to another tenant", bus.DecisionDenied, call.Tool)
		return
	}
	deadline := time.Duration(cs.cap.Constraints.DeadlineMsDefault) * time.Millisecond
	if deadline <= 0 {
		deadline = wire.DefaultDeadlineMs * time.Millisecond
	}
	deadline, ok = bus.CallDeadline(start, deadline, m.Header.Get(bus.HeaderBudgetMs), m.Header.Get(bus.HeaderDeadline),
		s.t.o.MaxClockSkew)
	if !ok {
		// Held somewhere (a reconnect buffer, a partition) past the time
		// its caller gave up: at-most-once means it must not start now.
		fail(schemas.CodeDeadlineExceeded, "the call's deadline passed before it reached the node", bus.DecisionTimeout, call.Tool)
		return
	}
	args := call.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if v, _ := cs.kind.Verb(name.Verb); v.Stream {
		s.openStream(ctx, m, call, cs, args, fail)
		return
	}

	// The tier's hop of the trace, when tracing is on: the device's work
	// is its child.
	traceparent := m.Header.Get(bus.HeaderTraceparent)
	var span *tracing.Span
	if tr := s.t.o.Tracer; tr != nil {
		tool := name.KindShort + ".*." + name.CapID + "." + name.Verb
		span, traceparent = tr.Start(ctx, traceparent, tracing.Name("tools/call", tool), trace.SpanKindServer,
			attribute.String("mcp.method.name", "tools/call"), attribute.String("gen_ai.tool.name", tool),
			attribute.String("gen_ai.operation.name", "execute_tool"), attribute.String("okso.node_id", s.nodeID),
			attribute.String("okso.request_id", reqID))
		inner := fail
		fail = func(code, msg, decision, tool string) {
			span.End(code)
			inner(code, msg, decision, tool)
		}
	}
	cmd := wire.Cmd{Tool: call.Tool, Arguments: args, DeadlineMs: int(deadline / time.Millisecond), RequestID: reqID}
	if s.trace && span != nil {
		// Only with tracing on: off, the hot path carries nothing more.
		cmd.Traceparent = traceparent
	}
	if s.deadlineAt {
		// On the clock the device was given at auth_ok, reckoned on the
		// monotonic clock since: a step of the wall clock moves neither.
		cmd.DeadlineAtMs = s.clockMs + (start.Sub(s.clockAt) + deadline).Milliseconds()
	}
	cmdID := wire.NewMsgID()
	frame, err := wire.EncodeID(wire.TypeCmd, cmdID, "", cmd)
	if err != nil {
		fail(schemas.CodeBadRequest, "malformed arguments", bus.DecisionInvalid, call.Tool)
		return
	}

	s.mu.Lock()
	if s.detached {
		s.mu.Unlock()
		fail(schemas.CodeNodeOffline, "node session ended", bus.DecisionOffline, call.Tool)
		return
	}
	if len(s.pending) >= s.t.o.MaxPendingPerNode {
		s.mu.Unlock()
		fail(schemas.CodeRateLimited, "too many calls in flight to this node", bus.DecisionRateLimit, call.Tool)
		return
	}
	if !cs.allow() {
		s.mu.Unlock()
		fail(schemas.CodeRateLimited, "capability rate limit exceeded", bus.DecisionRateLimit, call.Tool)
		return
	}
	if mc := cs.cap.Constraints.MaxConcurrency; mc > 0 && cs.inflight >= mc {
		s.mu.Unlock()
		fail(schemas.CodeRateLimited, "capability concurrency limit reached", bus.DecisionRateLimit, call.Tool)
		return
	}
	cs.inflight++
	p := &pendingCall{reply: m.Reply, cap: cs, tool: call.Tool, start: start, requestID: reqID,
		subject: m.Header.Get(bus.HeaderSubject)}
	if cs.cap.Kind == schemas.KindLocal {
		p.queryHash = queryHash(args)
	}
	p.span = span
	if s.pending == nil {
		s.pending = map[string]*pendingCall{}
	}
	s.pending[cmdID] = p
	p.timer = time.AfterFunc(deadline, func() { s.t.goFor(s, func() { s.expire(ctx, cmdID) }) })
	s.mu.Unlock()

	if err := s.writeRaw(ctx, frame); err != nil {
		if p := s.take(cmdID); p != nil {
			s.finish(p, bus.ErrorReply(schemas.CodeNodeOffline, "device connection failed"), bus.DecisionOffline, schemas.CodeNodeOffline)
		}
	}
}

func containsVerb(verbs []string, v string) bool {
	for _, x := range verbs {
		if x == v {
			return true
		}
	}
	return false
}

// take removes and returns a pending call, or nil if it already ended.
func (s *session) take(cmdID string) *pendingCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pending[cmdID]
	if p == nil {
		return nil
	}
	delete(s.pending, cmdID)
	p.cap.inflight--
	return p
}

// finish audits a call, then answers it. In that order: a started
// Auditor's goroutine, woken by the record, then runs after the reply's
// hop on this P rather than before it.
func (s *session) finish(p *pendingCall, reply []byte, decision, code string) {
	s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: p.subject, Tool: p.tool, NodeID: s.nodeID,
		Decision: decision, Code: code, Duration: time.Since(p.start), RequestID: p.requestID,
		QueryHash: p.queryHash})
	s.respond(p.reply, reply)
	p.span.End(code)
}

// queryHash returns the hex SHA-256 of the query in a local tool's
// arguments, as the tool receives it in TOOL_QUERY, or "" when it has
// none: the audit may say which query a run had, never what it said.
func queryHash(args []byte) string {
	var a struct {
		Query *string `json:"query"`
	}
	if json.Unmarshal(args, &a) != nil || a.Query == nil {
		return ""
	}
	sum := sha256.Sum256([]byte(*a.Query))
	return hex.EncodeToString(sum[:])
}

func (s *session) respond(reply string, data []byte) {
	if reply == "" {
		return
	}
	if err := s.t.o.NC.Publish(reply, data); err != nil {
		s.t.log.Warn("publish reply", "node_id", s.nodeID, "err", err)
	}
}

// expire ends a call whose device deadline passed, and tells the device to
// stop working on it.
func (s *session) expire(ctx context.Context, cmdID string) {
	p := s.take(cmdID)
	if p == nil {
		return
	}
	s.finish(p, bus.ErrorReply(schemas.CodeDeadlineExceeded, "device did not answer within its deadline"),
		bus.DecisionTimeout, schemas.CodeDeadlineExceeded)
	if err := s.write(ctx, wire.TypeCancel, cmdID, wire.Cancel{}); err != nil {
		s.t.log.Debug("cancel an expired cmd", "node_id", s.nodeID, "err", err)
	}
}

// onAck completes the call a cmd_ack answers; a late or unknown ack is
// dropped and audited.
func (s *session) onAck(ctx context.Context, e wire.Envelope) {
	if e.InReplyTo == "" {
		s.close(wire.CloseMalformed, "", "cmd_ack without in_reply_to")
		return
	}
	var ack wire.CmdAck
	if err := wire.DecodePayload(e, &ack); err != nil {
		s.close(wire.CloseMalformed, "", "malformed cmd_ack payload")
		return
	}
	p := s.take(e.InReplyTo)
	if p == nil {
		if st := s.dropStream(ctx, e.InReplyTo, false); st != nil {
			// The device ended a stream on its own: its gateway sees the
			// device as gone for this stream.
			s.endStream(st, bus.ReasonDeviceOffline)
			return
		}
		s.t.audit(bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
			Decision: bus.DecisionLateAck, RequestID: e.InReplyTo})
		return
	}
	p.timer.Stop()
	switch {
	case ack.OK && len(ack.Result) > 0:
		s.finish(p, bus.OKReply(ack.Result), bus.DecisionAllowed, "")
	case ack.OK:
		s.finish(p, bus.ErrorReply(schemas.CodeInternal, "device answered without a result"), bus.DecisionFailed, schemas.CodeInternal)
	default:
		code := schemas.CodeInternal
		if ack.Error != nil && schemas.KnownCode(ack.Error.Code) {
			code = ack.Error.Code
		}
		s.finish(p, bus.ErrorReply(code, fmt.Sprintf("device reported %s", code)), bus.DecisionFailed, code)
	}
}
