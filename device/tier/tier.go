// Package tier is the device tier, okso device: it accepts devices'
// okso.v1 WebSockets, keeps one session per node that owns the node's NATS
// subjects and registry record, enforces the node's rate and concurrency
// limits, forwards each call as a cmd and correlates its cmd_ack
// (DESIGN.md §2–4).
//
// Make a [Tier] with [New], serve its [Tier.Handler] (an http.Handler) on
// a listener, and call [Tier.Shutdown] before stopping the listener:
// devices get 1001 and reconnect elsewhere, and Shutdown returns once
// every goroutine of the tier has ended. ExampleNew runs one on an
// embedded NATS server; roles/ composes one into okso device and okso
// all-in-one.
//
// The tier meets the gateway only on NATS (package bus) and its devices
// only on a socket, speaking package wire: it imports neither the gateway
// nor the device end (package agent), not even in its tests, which play
// devices by hand through wire. The tier and real devices together are
// tested in device/e2e.
package tier

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/workers"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// Options configure a [Tier]. NC, Registry, Bindings, Schemas and
// Verifier are required; every other zero value means the protocol default.
type Options struct {
	NC       *nats.Conn
	Registry *bus.Registry
	// Bindings says which tenant owns a node id; a session of another
	// tenant for it is refused with 4403. A session holds its node's
	// binding with no TTL and gives it its TTL when it ends; the tier's
	// sweep does for the sessions of tiers that died.
	Bindings *bus.Bindings
	Schemas  *schemas.Set
	Verifier *auth.Verifier // for device tokens (audience okso-device)
	Auditor  *bus.Auditor
	// Metrics, when set, is where the tier registers its metrics
	// (DESIGN.md §11); nil: none.
	Metrics prometheus.Registerer
	// Tracer, when set, makes a span of each call to a node, a child of
	// the gateway's (the traceparent header).
	Tracer *tracing.Tracer
	Logger *slog.Logger

	// Name identifies this tier instance in the registry: its lease's
	// key, and the tier of its nodes' records. It must be unique to the
	// instance ([bus.ValidTierID]); by default it is made at random.
	Name string
	// AuthTimeout bounds the time from upgrade to auth, and from auth to
	// announce (5 s).
	AuthTimeout time.Duration
	// MaxFrameBytes is the largest frame a device may send (64 KiB).
	MaxFrameBytes int
	// PingInterval is how long a device may stay silent before the tier
	// pings it ([DefaultPingInterval]): a device heard from (any frame, its
	// own ping, a pong, a heartbeat) within the interval is not pinged.
	PingInterval time.Duration
	// PingTimeout is how long a pinged device has to answer
	// ([DefaultPingTimeout]): one heard from for no
	// PingInterval+PingTimeout is dropped with 4408.
	PingTimeout time.Duration
	// WriteTimeout bounds one frame write (5 s).
	WriteTimeout time.Duration
	// Requesters, when set, are the roles whose requests the tier serves
	// ([bus.FromRole]): a message that reached a node's subject without a
	// reply subject of theirs (JetStream, made to publish there by another
	// role's client) is dropped and audited. Nil: any request.
	Requesters []bus.Role
	// Kinds, when set, returns the kind table the tier projects manifests
	// with: the built-in kinds and the registered ones it follows (KV
	// okso_kinds). Nil, or returning nil: the built-in kinds alone.
	Kinds func() *schemas.KindTable
	// Revoked, when set, says whether a device token id was revoked.
	Revoked interface{ Revoked(jti string) bool }
	// ClientCerts says the listener verifies devices' certificates
	// (device mTLS): a session's token must then name the node id of its
	// verified certificate ([schemas.CertNodeID]), else it is refused
	// with 4403, and so is a session without one.
	ClientCerts bool

	// ConnRatePerIP and ConnBurstPerIP bound connection attempts from one
	// source address (100/s, bursts of 1000); excess ones close with 4429.
	// A negative rate turns the guard off.
	ConnRatePerIP  float64
	ConnBurstPerIP int
	// MaxSessions bounds the connections the tier holds (50000); excess
	// ones close with 4429.
	MaxSessions int
	// MaxHandshakes bounds the handshakes (from the WebSocket upgrade to
	// announce_ok, or the session's end) the tier runs at once
	// ([DefaultMaxHandshakes]; negative: no bound). A device beyond them
	// waits up to [handshakeWait] for one to end, then is closed with
	// 4429 and comes back after its backoff. Each handshake reads and
	// writes JetStream a few times: when NATS is slow (a connect storm
	// after a tier died, a JetStream election), the bound slows connects
	// down, rather than let thousands of them wait on NATS at once, each
	// time out, and come back as more of the storm.
	MaxHandshakes int
	// MaxPendingPerNode bounds the calls in flight to one node (64), on top
	// of its capabilities' own limits; excess calls get E_RATE_LIMITED.
	MaxPendingPerNode int
	// MaxToolsPerTenant bounds the tools a tenant's nodes register in all,
	// on every tier ([DefaultMaxToolsPerTenant]); an announce that would
	// exceed it is refused with 4403. Negative: no cap. The tier counts
	// from a watch of the registry, which it keeps only with a cap.
	MaxToolsPerTenant int
	// MaxClockSkew is how far apart the clocks of gateways and tiers may
	// be ([DefaultMaxClockSkew]): a call whose Okso-Deadline passed longer
	// ago than that is refused, and one that has not runs at most until
	// then.
	MaxClockSkew time.Duration
	// Nodes are the operator's names and labels of nodes, by node id
	// (okso device --node-labels): they win over what a device
	// announces and over its token's labels, key by key. Read-only once
	// the tier is made.
	Nodes map[string]NodeSettings
}

// DefaultMaxClockSkew is the clock skew between gateway and tier hosts a
// tier tolerates unless told otherwise: far more than NTP leaves between
// hosts, far less than a call's budget.
const DefaultMaxClockSkew = 250 * time.Millisecond

// DefaultPingInterval and DefaultPingTimeout make a silent device's
// keepalive its own: an okso device sends a heartbeat (an unsolicited
// pong, which the tier hears without answering) after 30 s of its own
// silence; only a device silent for 45 s (one that sends neither frames
// nor heartbeats) is pinged by the tier, and one silent for 60 s is
// dropped with 4408. A ping costs the tier three system calls (the ping
// read, the pong written, the read that finds nothing more), about 11 µs
// each on a small VM, and a hand-off to a worker; a heartbeat one raw
// read on the session's own goroutine. Pinging every idle device itself
// every 15 s, as it did, took an idle tier 4 µs/s per device, answering
// its devices' pings every 30 s 2.9, hearing their heartbeats 1.65, and
// with one raw read each 0.98 (make scale N=10000, make idle-allinone),
// and a battery-powered device wakes its radio half as often.
const (
	DefaultPingInterval = 45 * time.Second
	DefaultPingTimeout  = 15 * time.Second
)

// DefaultMaxHandshakes is the handshakes a tier runs at once by default
// (--max-handshakes). A handshake takes three round trips to its device
// and four JetStream requests: a few milliseconds on a LAN, a second or
// so over a slow cellular link, when 256 still let 10,000 devices come
// back within a minute of their tier's failover.
const DefaultMaxHandshakes = 256

// handshakeWait is how long a device waits for a handshake to end when
// MaxHandshakes are in progress, before it is closed with 4429.
const handshakeWait = 2 * time.Second

// Tier is the device tier: it accepts device WebSockets at [wire.Path], keeps one
// session per node, and serves each node's NATS subject. It is safe for
// concurrent use.
type Tier struct {
	o   Options
	log *slog.Logger

	// manifests are the sessions' manifests, each shared by the sessions
	// that announced it.
	manifests manifests

	mu       sync.Mutex
	sessions map[string]*session // by node id
	all      map[*session]struct{}
	closing  bool // Shutdown has begun: no new session
	// wg counts the goroutine of every session in all, and every goroutine
	// started on a session's behalf ([Tier.goFor]); Shutdown waits for it.
	wg    sync.WaitGroup
	perIP map[string]*rate.Limiter // connection attempts, by source address
	// handshakes holds a token per handshake in progress (nil: no bound).
	handshakes chan struct{}
	storms     storms

	// cancelSub serves the cancel subject of every node: one
	// subscription (and one goroutine) for the tier rather than one per
	// session, which at tens of thousands of devices is memory that counts.
	cancelSub *nats.Subscription
	// cmds gets the messages of every node's cmd subscription, for the
	// same reason: [Tier.dispatch] hands each to its session.
	cmds chan *nats.Msg
	// inbox prefixes the reply subject of every stream frame: a frame
	// nobody listens to comes back to inboxSub as "no responders", and
	// its stream stops.
	inbox    string
	inboxSub *nats.Subscription

	// lease is the tier's lease (okso_tiers), under which its sessions
	// write their nodes' records; leased is closed once it is held.
	lease  *bus.TierLease
	leased chan struct{}
	// orphans indexes the online records of every tier, from the tier's
	// watch of the registry, for its sweep of dead tiers' records.
	orphans *bus.Orphans

	// metrics count what the tier audits and closes (metrics.go); nil:
	// none.
	metrics *tierMetrics

	// steps read and handle the sessions' messages, one of a session's
	// at a time (see [session.serve]); closed by Shutdown once every
	// session has ended.
	steps *workers.Pool

	// live watches every session's device from announce on, and pings
	// or drops the silent ones; it runs as the tier's own goroutines do.
	live *liveness

	// tools counts each tenant's tools, from a watch of the registry;
	// nil without a cap.
	tools *toolCounts
	// bg counts the tier's own goroutines (the dispatcher, the tool
	// watch), which run until stopBG or the NATS connection's close.
	bg       sync.WaitGroup
	stopBG   context.CancelFunc
	stopOnce sync.Once
	stopErr  error // of the subscriptions' end, for the first Shutdown
}

// cmdQueue is the capacity of the tier's call channel. NATS drops a
// message that finds it full (the caller then times out), so it is large:
// the dispatcher only looks the node up and starts a goroutine.
const cmdQueue = 1 << 16

// New checks o and returns a tier ready to serve.
func New(o Options) (*Tier, error) {
	if err := checkNodes(o.Nodes); err != nil {
		return nil, fmt.Errorf("device tier: %w", err)
	}
	if o.NC == nil || o.Registry == nil || o.Bindings == nil || o.Schemas == nil || o.Verifier == nil {
		return nil, errors.New("device tier: NC, Registry, Bindings, Schemas and Verifier are required")
	}
	if o.AuthTimeout <= 0 {
		o.AuthTimeout = wire.DefaultAuthTimeoutMs * time.Millisecond
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = wire.DefaultMaxFrameBytes
	}
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
		if o.PingTimeout <= 0 {
			o.PingTimeout = DefaultPingTimeout
		}
	}
	if o.PingTimeout <= 0 {
		o.PingTimeout = o.PingInterval
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
	if o.Name == "" {
		o.Name = "tier-" + strings.ToLower(wire.NewMsgID()[16:])
	}
	if !bus.ValidTierID(o.Name) {
		return nil, fmt.Errorf("device tier: name %q: letters, digits, '-' and '_' only", o.Name)
	}
	if o.ConnRatePerIP == 0 {
		o.ConnRatePerIP = 100
	}
	if o.ConnBurstPerIP <= 0 {
		o.ConnBurstPerIP = 1000
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 50000
	}
	if o.MaxHandshakes == 0 {
		o.MaxHandshakes = DefaultMaxHandshakes
	}
	if o.MaxPendingPerNode <= 0 {
		o.MaxPendingPerNode = 64
	}
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = DefaultMaxClockSkew
	}
	if o.MaxToolsPerTenant == 0 {
		o.MaxToolsPerTenant = DefaultMaxToolsPerTenant
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tier{o: o, log: log, sessions: map[string]*session{}, all: map[*session]struct{}{},
		perIP: map[string]*rate.Limiter{}, cmds: make(chan *nats.Msg, cmdQueue), leased: make(chan struct{}), orphans: bus.NewOrphans(),
		live: newLiveness(o.PingInterval, o.PingTimeout), steps: workers.New(64)}
	if o.MaxHandshakes > 0 {
		t.handshakes = make(chan struct{}, o.MaxHandshakes)
	}
	t.metrics = newTierMetrics(o.Metrics, t)
	sub, err := o.NC.Subscribe(bus.NodeCancel("*"), t.onCancel)
	if err != nil {
		return nil, fmt.Errorf("device tier: subscribe to cancels: %w", err)
	}
	t.cancelSub = sub
	t.inbox = o.NC.NewInbox() // of the role's own reply subjects: the only ones it may read
	if t.inboxSub, err = o.NC.Subscribe(t.inbox+".*.*", t.onNoListener); err != nil {
		return nil, errors.Join(fmt.Errorf("device tier: subscribe to its stream inbox: %w", err), sub.Unsubscribe())
	}
	if o.MaxToolsPerTenant > 0 {
		t.tools = newToolCounts()
	}
	// The tier's own goroutines run until Shutdown, or until the NATS
	// connection closes if Shutdown never comes; Shutdown waits for them.
	ctx, cancel := context.WithCancel(context.Background())
	t.stopBG = cancel
	closed := o.NC.StatusChanged(nats.CLOSED)
	t.bg.Go(func() {
		defer o.NC.RemoveStatusListener(closed)
		select {
		case <-closed:
			cancel()
		case <-ctx.Done():
		}
	})
	t.bg.Go(func() { t.dispatch(ctx) })
	t.bg.Go(func() { t.live.run(ctx) })
	t.bg.Go(func() { t.holdLease(ctx) })
	t.bg.Go(func() { t.watchRecords(ctx) })
	return t, nil
}

// holdLease takes the tier's lease, then refreshes it every third of
// the registry's TTL until ctx ends, and then releases it. When the
// lease lapsed meanwhile (NATS was away longer than the TTL), every
// session writes its node's record again. This is the tier's only
// periodic write: nothing is refreshed per node.
func (t *Tier) holdLease(ctx context.Context) {
	period := t.o.Registry.TTL() / 3
	wait := 100 * time.Millisecond
	for t.lease == nil {
		lctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		l, err := t.o.Registry.HoldTier(lctx, t.o.Name)
		cancel()
		if err == nil {
			t.lease = l // before leased is closed: read only after it
			close(t.leased)
			t.bg.Go(func() { t.sweep(ctx) })
			break
		}
		t.log.Warn("take the tier's lease", "tier", t.o.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, period)
	}
	defer func() {
		// The sessions have left (Shutdown stops the tier's goroutines
		// after them): nodes whose records could not say so go offline now.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := t.lease.Release(rctx); err != nil {
			t.log.Warn("release the tier's lease", "tier", t.o.Name, "err", err)
		}
	}()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		lapsed, err := t.lease.Refresh(lctx)
		cancel()
		if err != nil {
			t.log.Warn("refresh the tier's lease", "tier", t.o.Name, "err", err)
			continue
		}
		if lapsed {
			t.log.Warn("the tier's lease had lapsed: writing its nodes' records again", "tier", t.o.Name)
			t.reassert(ctx)
		}
	}
}

// sweep marks offline the records dead tiers left online, while the
// tier runs ([bus.TierLease.Sweep]), following again a second after its
// watch fails.
func (t *Tier) sweep(ctx context.Context) {
	for {
		err := t.lease.Sweep(ctx, t.orphans, t.o.Bindings, t.log)
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("sweep dead tiers' records", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// reassert has every session write its node's record again.
func (t *Tier) reassert(ctx context.Context) {
	t.mu.Lock()
	keepers := make([]*keeper, 0, len(t.sessions))
	for _, s := range t.sessions {
		s.mu.Lock()
		if s.keeper != nil {
			keepers = append(keepers, s.keeper)
		}
		s.mu.Unlock()
	}
	t.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, k := range keepers {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			kctx, cancel := context.WithTimeout(ctx, refreshTimeout)
			defer cancel()
			k.reassert(kctx)
		})
	}
	wg.Wait()
}

// goFor runs f on a goroutine of its own on behalf of s, which Shutdown
// waits for as it waits for s's own; once s has ended, f does not run,
// for there is nothing left for it to do. f may block on the device (a
// close handshake, a write): it runs for no caller, so it gets no
// caller's context, and its writes are bounded by the session's write
// guard.
func (t *Tier) goFor(s *session, f func()) {
	t.mu.Lock()
	_, live := t.all[s]
	if live {
		// s's goroutine still counts, so wg is not at zero: this Add may
		// come while Shutdown waits.
		t.wg.Add(1)
	}
	t.mu.Unlock()
	if live {
		go func() {
			defer t.wg.Done()
			f()
		}()
	}
}

// reply answers a call on its reply subject, if it has one.
func (t *Tier) reply(m *nats.Msg, data []byte) {
	if m.Reply == "" {
		return
	}
	if err := t.o.NC.Publish(m.Reply, data); err != nil {
		t.log.Warn("publish reply", "subject", m.Subject, "err", err)
	}
}

// dispatch queues each call on its node's session, whose calls a worker
// serves in order, until ctx ends (the tier shut down, or its NATS
// connection closed); it returns once its workers have. A call for a node
// with no session here (it left while the call was queued) is answered
// E_NODE_OFFLINE; one beyond MaxPendingPerNode queued calls,
// E_RATE_LIMITED. The workers' writes to devices take ctx.
func (t *Tier) dispatch(ctx context.Context) {
	w := workers.New(64)
	defer w.Close()
	for {
		select {
		case m := <-t.cmds:
			id, _ := bus.NodeOfSubject(m.Subject)
			t.mu.Lock()
			s := t.sessions[id]
			t.mu.Unlock()
			if t.o.Requesters != nil && !bus.FromRole(m, t.o.Requesters...) {
				// Audited to the node's tenant, if it is here: the
				// message's own tenant header is anybody's word.
				e := bus.AuditEvent{NodeID: id, Decision: bus.DecisionDenied, Code: schemas.CodeSafetyDenied}
				if s != nil {
					e.Tenant = s.tenant
				}
				t.audit(e)
				t.log.Warn("dropped a message on a node's subject that no gateway sent", "node_id", id, "reply", m.Reply)
				continue
			}
			if s == nil {
				t.reply(m, bus.ErrorReply(schemas.CodeNodeOffline, "node session ended"))
				continue
			}
			if !s.enqueue(ctx, m, w, t.o.MaxPendingPerNode) {
				t.reply(m, bus.ErrorReply(schemas.CodeRateLimited, "too many calls queued for this node"))
				t.audit(bus.AuditEvent{Tenant: m.Header.Get(bus.HeaderTenant), Subject: m.Header.Get(bus.HeaderSubject),
					NodeID: id, Decision: bus.DecisionRateLimit, Code: schemas.CodeRateLimited,
					RequestID: m.Header.Get(bus.HeaderRequestID)})
			}
		case <-ctx.Done():
			// Calls still queued find no session any more.
			for {
				select {
				case m := <-t.cmds:
					t.reply(m, bus.ErrorReply(schemas.CodeNodeOffline, "device tier shut down"))
				default:
					return
				}
			}
		}
	}
}

// onCancel hands a message of a node's cancel subject (a stream to stop,
// or another session's takeover) to the node's session here, if any.
// Every tier hears every node's cancels; they are rare, and dropped at
// once for nodes served elsewhere.
func (t *Tier) onCancel(m *nats.Msg) {
	id, ok := bus.NodeOfSubject(m.Subject)
	if !ok || bus.FromJetStream(m) { // no gateway's or tier's
		return
	}
	t.mu.Lock()
	s := t.sessions[id]
	t.mu.Unlock()
	if s != nil {
		// It may write to a slow device: not on the subscription's goroutine.
		t.goFor(s, func() { s.onCancel(context.Background(), m) })
	}
}

// Handler returns the tier's HTTP handler: the device protocol at [wire.Path]
// and a liveness probe at /healthz.
func (t *Tier) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+wire.Path, t.serveWS)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		t.mu.Lock()
		closing := t.closing
		t.mu.Unlock()
		switch {
		case closing:
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !t.o.NC.IsConnected():
			http.Error(w, "NATS disconnected", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ready\n"))
		}
	})
	return mux
}

// Revoke closes, with 4401, every session authenticated by the token jti
// (call it when a token is revoked).
func (t *Tier) Revoke(jti string) {
	t.mu.Lock()
	var hit []*session
	for s := range t.all {
		s.mu.Lock()
		if s.jti == jti {
			hit = append(hit, s)
		}
		s.mu.Unlock()
	}
	t.mu.Unlock()
	for _, s := range hit {
		s.mu.Lock()
		e := bus.AuditEvent{Tenant: s.tenant, Subject: s.subject, JTI: s.jti, NodeID: s.nodeID,
			Decision: bus.DecisionRevoked, Code: schemas.CodeSafetyDenied}
		s.mu.Unlock()
		t.audit(e)
		s.detach()
		t.goFor(s, func() { s.close(wire.CloseAuthFailed, "", "token revoked") })
	}
}

// Sessions returns the number of nodes with a live session.
func (t *Tier) Sessions() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions)
}

// Shutdown closes every session with 1001 (devices reconnect elsewhere),
// refuses new ones, and returns once every goroutine of the tier has
// ended: the sessions, their closes, the call dispatcher and the tool
// watch. If ctx ends first, the devices still connected are dropped
// without waiting for their close handshake, and Shutdown returns ctx's
// error once their sessions have ended (at once, unless NATS is
// unreachable: then within its own timeouts). It may be called more than
// once; the tier cannot be used after it.
func (t *Tier) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	t.closing = true
	all := make([]*session, 0, len(t.all))
	for s := range t.all {
		all = append(all, s)
	}
	t.mu.Unlock()
	for _, s := range all {
		// Stop serving the node now: a call that comes in while the
		// session closes gets no responders, not a queue nobody reads.
		s.detach()
		t.goFor(s, func() { s.close(wire.CloseGoingAway, "", "tier shutting down") })
	}
	sessionsDone := make(chan struct{})
	go func() { // waited for below, on every path
		t.wg.Wait()
		close(sessionsDone)
	}()
	var err error
	select {
	case <-sessionsDone:
	case <-ctx.Done():
		err = fmt.Errorf("device tier shutdown: %w", ctx.Err())
		t.mu.Lock()
		for s := range t.all {
			s.drop()
		}
		t.mu.Unlock()
		<-sessionsDone
	}
	// The tier's own subscriptions and its dispatcher stay until the last
	// session has ended: a call still in flight to a closing session is
	// answered, not left to its deadline.
	t.stopOnce.Do(func() {
		t.stopErr = errors.Join(t.cancelSub.Unsubscribe(), t.inboxSub.Unsubscribe())
		t.stopBG()
		t.steps.Close() // no session is left to step
	})
	t.bg.Wait()
	if t.stopErr != nil {
		err = errors.Join(err, fmt.Errorf("device tier shutdown: %w", t.stopErr))
	}
	return err
}

func (t *Tier) serveWS(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		http.Error(w, "tier shutting down", http.StatusServiceUnavailable)
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	handed := false
	defer func() {
		if !handed {
			t.wg.Done()
		}
	}()

	hw := &hijackRecorder{ResponseWriter: w}
	// A device's pings and pongs are signs of life as good as its frames.
	live := new(peer)
	c, err := websocket.Accept(hw, r, &websocket.AcceptOptions{
		Subprotocols:    []string{wire.Subprotocol},
		CompressionMode: websocket.CompressionDisabled,
		OnPingReceived:  func(context.Context, []byte) bool { t.live.hear(live); return true },
		OnPongReceived:  func(context.Context, []byte) { t.live.hear(live) },
	})
	if err != nil {
		return // Accept has written the HTTP error
	}
	// The tier enforces its own frame limit so that an oversize frame closes
	// with 4413, not the library's 1009.
	c.SetReadLimit(-1)
	s := newSession(t, c, live, r)
	s.raw, s.idle = hw.conn, hw.idle
	if s.idle != nil {
		s.idle.heartbeat = func() { t.live.hear(live) }
	}
	t.mu.Lock()
	refuse := ""
	switch {
	case !t.allowConnLocked(r.RemoteAddr):
		refuse = "too many connection attempts from this address"
	case len(t.all) >= t.o.MaxSessions:
		refuse = "tier at its session limit"
	}
	t.all[s] = struct{}{}
	t.mu.Unlock()
	if refuse == "" && !t.startHandshake() {
		refuse = "tier busy: too many devices connecting at once, try again later"
	}
	if refuse != "" {
		s.close(wire.CloseTooMany, "", refuse)
		t.forget(s)
		return
	}
	// The session outlives this handler: returning lets net/http free the
	// upgrade request and its connection goroutine, whose stack a parked
	// session would otherwise hold for as long as the device stays.
	handed = true
	// Nor does the session keep the request's context: nothing in it is
	// the session's, and it would stay as long as the device.
	go t.runSession(s, func() func() { return s.run(context.Background()) })
}

// startHandshake takes a token for a handshake, waiting up to
// handshakeWait for one when MaxHandshakes are in progress; it reports
// whether it got one, which endHandshake gives back.
func (t *Tier) startHandshake() bool {
	if t.handshakes == nil {
		return true
	}
	select {
	case t.handshakes <- struct{}{}:
		return true
	default:
	}
	wait := time.NewTimer(handshakeWait)
	defer wait.Stop()
	select {
	case t.handshakes <- struct{}{}:
		return true
	case <-wait.C:
		return false
	}
}

func (t *Tier) endHandshake() {
	if t.handshakes != nil {
		<-t.handshakes
	}
	t.storms.ended()
}

// runSession runs a stage of s on this goroutine: the handshake, which
// returns the next stage, the read loop, on a goroutine of its own (see
// [session.run]). The session's goroutine is the one running a stage, which
// t.wg counts; the last one forgets s.
func (t *Tier) runSession(s *session, stage func() (next func())) {
	handedOff := false
	defer func() {
		if !handedOff {
			t.forget(s)
			t.wg.Done()
		}
	}()
	// Hostile input must not take every device down with it: net/http
	// would have recovered a panic in its handler, so this does too.
	defer func() {
		if r := recover(); r != nil {
			t.log.Error("device session panicked", "node_id", s.nodeID, "panic", r, "stack", string(debug.Stack()))
			s.close(wire.CloseGoingAway, schemas.CodeInternal, "tier error")
		}
	}()
	if next := stage(); next != nil {
		handedOff = true
		go t.runSession(s, func() func() { next(); return nil })
	}
}

// forget drops a session that has ended from the tier's set.
func (t *Tier) forget(s *session) {
	t.mu.Lock()
	delete(t.all, s)
	t.mu.Unlock()
}

// allowConnLocked takes one connection attempt of addr's host from its
// budget; t.mu is held. Budgets full again are forgotten, so the map stays
// as small as the set of addresses connecting right now.
func (t *Tier) allowConnLocked(addr string) bool {
	if t.o.ConnRatePerIP < 0 {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if len(t.perIP) > 4096 {
		for h, l := range t.perIP {
			if l.Tokens() >= float64(t.o.ConnBurstPerIP) {
				delete(t.perIP, h)
			}
		}
	}
	l := t.perIP[host]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(t.o.ConnRatePerIP), t.o.ConnBurstPerIP)
		t.perIP[host] = l
	}
	return l.Allow()
}

// attach makes s the session of its node, detaching any older one, which is
// then closed with 4409 off this goroutine (Close waits for the peer).
func (t *Tier) attach(s *session) bool {
	t.mu.Lock()
	if t.closing || s.closed() { // a session its deadline closed takes no node
		t.mu.Unlock()
		return false
	}
	old := t.sessions[s.nodeID]
	t.sessions[s.nodeID] = s
	t.mu.Unlock()
	if old != nil {
		old.detach()
		t.goFor(old, func() { old.close(wire.CloseReplaced, "", "replaced by a newer session") })
	}
	return true
}

// release forgets s if it is still its node's session.
func (t *Tier) release(s *session) {
	t.mu.Lock()
	if t.sessions[s.nodeID] == s {
		delete(t.sessions, s.nodeID)
	}
	t.mu.Unlock()
}

// toolCountWait bounds how long an announce waits for a tier that has
// just started to load its tool counts; past it, it is admitted on the
// counts so far.
const toolCountWait = 5 * time.Second

// admitTools counts the tools of s's announce against its tenant's cap,
// and reports whether they fit.
func (t *Tier) admitTools(s *session, tools int) bool {
	if t.tools == nil {
		return true
	}
	select {
	case <-t.tools.ready:
	default:
		wait := time.NewTimer(toolCountWait)
		select {
		case <-t.tools.ready:
		case <-s.done:
		case <-wait.C:
			t.log.Warn("announce admitted before the tool counts loaded", "node_id", s.nodeID)
		}
		wait.Stop()
	}
	return t.tools.admit(s.id, s.nodeID, s.tenant, tools, t.o.MaxToolsPerTenant)
}

func (t *Tier) audit(e bus.AuditEvent) {
	e.Actor = "tier"
	t.o.Auditor.Record(e)
	t.metrics.event(&e)
}

// hijackRecorder keeps the connection the WebSocket library hijacks, so a
// session can drop it when a close handshake stalls (the library reads the
// rest of a half-read frame without a deadline).
type hijackRecorder struct {
	http.ResponseWriter
	conn net.Conn
	// idle is what the WebSocket library reads, when the connection had
	// nothing buffered at the upgrade (see [idleConn]); nil otherwise.
	idle *idleConn
}

// Hijack also swaps net/http's 4 KiB buffers for smaller ones, when they
// hold nothing yet: the WebSocket library keeps them for the life of the
// session, and device frames are mostly a few hundred bytes (a larger
// frame is read and written through, not copied).
func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	h.conn = c
	if err != nil {
		return c, brw, err
	}
	if brw.Writer.Buffered() == 0 {
		brw.Writer = bufio.NewWriterSize(c, sessionBufSize)
	}
	if brw.Reader.Buffered() == 0 {
		// The library reads c through what it is handed back: idle
		// counts the frames from the device's first byte.
		h.idle = newIdleConn(c)
		brw.Reader = bufio.NewReaderSize(h.idle, sessionBufSize)
		return h.idle, brw, nil
	}
	return c, brw, err
}

// sessionBufSize is the read and the write buffer of a device session:
// enough for a cmd, a cmd_ack or a stream frame of a built-in kind (a few
// hundred bytes); a larger frame costs a read, or a write, more. Each
// buffer is a connection's for as long as it lasts, idle or not.
const sessionBufSize = 512
