package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// Options configure a [Tier]. NC, Remotes and Config are required; every
// other zero value means the default.
type Options struct {
	NC      *nats.Conn
	Remotes *bus.Remotes
	Config  *Config
	Auditor *bus.Auditor
	Logger  *slog.Logger

	// MaxClockSkew is how far a gateway's clock may be from this host's
	// when the tier reads a call's absolute deadline (250 ms).
	MaxClockSkew time.Duration
	// MaxInFlight bounds the calls one upstream serves at once (256); a
	// call beyond it is E_RATE_LIMITED at once.
	MaxInFlight int
	// MinBackoff and MaxBackoff bound the wait before an upstream that
	// could not be reached or listed is tried again (1 s and 30 s; each
	// wait is jittered).
	MinBackoff, MaxBackoff time.Duration
	// StopGrace is how long a stopping tier lets the calls in flight
	// finish before it ends them, answered E_NODE_OFFLINE (5 s).
	StopGrace time.Duration
	// Dial connects to an upstream; nil: by its transport ([DialStdio],
	// [DialHTTP], [NewAction]).
	Dial func(ctx context.Context, u *Upstream, log *slog.Logger) (Client, error)
	// Replica names this replica in the records it writes and in its
	// logs; empty: the host name and a random suffix.
	Replica string
	// Requesters, when set, are the roles whose requests the tier serves
	// ([bus.FromRole]; a replica's probe comes from the remote role):
	// a message that reached an upstream's subject any other way is
	// dropped. Nil: any request.
	Requesters []bus.Role
	// Tracer, when set, makes a span of each call of an upstream's tool,
	// a child of the gateway's, whose context the upstream is given.
	Tracer *tracing.Tracer
	// Metrics, when set, is where the tier registers its metrics
	// (DESIGN.md §11); nil: none.
	Metrics prometheus.Registerer
}

// Tier is the remote tier: for each configured upstream it keeps a
// connection, lists the allowed tools into KV okso_remotes under a lease,
// and serves the upstream's calls on NATS, until its context ends. An
// upstream that cannot be listed has its record removed and is tried
// again with backoff; one broken upstream never affects the others.
type Tier struct {
	o       Options
	log     *slog.Logger
	started time.Time // when New built it: of two replicas that list an upstream differently, the newer's record stays

	// calls count the calls answered, by upstream and outcome; connected
	// says, by upstream, whether a session serves it (metrics.go).
	calls     *prometheus.CounterVec
	connected sync.Map // upstream name -> *atomic.Bool
}

// New checks o and builds a tier.
func New(o Options) (*Tier, error) {
	if o.NC == nil || o.Remotes == nil || o.Config == nil {
		return nil, errors.New("remote tier: NC, Remotes and Config are required")
	}
	if o.MaxClockSkew <= 0 {
		o.MaxClockSkew = 250 * time.Millisecond
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(30*time.Second, o.MinBackoff)
	}
	if o.Dial == nil {
		o.Dial = dial
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.Auditor == nil {
		o.Auditor = &bus.Auditor{}
	}
	if o.Replica == "" {
		host, _ := os.Hostname()
		o.Replica = fmt.Sprintf("%s-%08x", host, rand.Uint32())
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Tier{o: o, log: log, started: time.Now()}
	t.registerMetrics(o.Metrics)
	return t, nil
}

// Upstreams returns the names of the configured upstreams.
func (t *Tier) Upstreams() []string {
	names := make([]string, len(t.o.Config.Upstreams))
	for i, u := range t.o.Config.Upstreams {
		names[i] = u.Name
	}
	return names
}

// dial connects to an upstream by its transport.
func dial(ctx context.Context, u *Upstream, log *slog.Logger) (Client, error) {
	switch u.Transport {
	case "stdio":
		return DialStdio(ctx, StdioOptions{Command: u.Command, Env: u.Env, Log: log})
	case "http":
		return DialHTTP(ctx, HTTPOptions{URL: u.URL, Headers: u.Headers, Log: log})
	case "action":
		return NewAction(ActionOptions{Command: u.Command, Env: u.Env, Timeout: u.Timeout, Log: log}), nil
	}
	return nil, fmt.Errorf("transport %q", u.Transport)
}

// Run keeps every upstream until ctx ends, then stops serving them,
// removes their records and closes their connections (a stdio upstream's
// process group is reaped) before it returns.
func (t *Tier) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for i := range t.o.Config.Upstreams {
		u := &t.o.Config.Upstreams[i]
		wg.Go(func() { t.keep(ctx, u) })
	}
	wg.Wait()
	return nil
}

// keep connects to one upstream, serves it while it lists, and connects
// again each time it fails: at once when the connection ended after it
// served a while (a stdio process died, an HTTP session was lost), so
// that calls wait for the next session rather than fail; with jittered
// backoff when the upstream could not be reached or listed, or keeps
// ending as soon as it is listed.
func (t *Tier) keep(ctx context.Context, u *Upstream) {
	s := &upstream{t: t, cfg: u, log: t.log.With("upstream", u.Name),
		sem: make(chan struct{}, t.o.MaxInFlight), kick: make(chan struct{}, 1)}
	s.state.Store(&serving{down: true, changed: make(chan struct{})})
	up := &atomic.Bool{}
	t.connected.Store(u.Name, up)
	s.up = up
	// calls is the context of the calls the upstream's subscription
	// admits: leave ends it StopGrace after the tier began to stop,
	// ending the calls still in flight.
	calls, endCalls := context.WithCancel(context.Background())
	defer endCalls()
	defer s.retiring.Wait()
	backoff := t.o.MinBackoff
	quick := false // the last session that served ended sooner than the backoff
	for {
		began := time.Now()
		served, why := s.session(ctx, calls)
		if ctx.Err() != nil {
			s.leave(ctx, nil, endCalls)
			return
		}
		if served && time.Since(began) >= backoff {
			backoff, quick = t.o.MinBackoff, false
			continue
		}
		if served && !quick {
			// One session that ended soon after it was listed is
			// connected again at once too; the next in a row backs off
			// (an upstream that keeps dying).
			quick = true
			continue
		}
		s.leave(ctx, why, endCalls)
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			s.leave(ctx, nil, endCalls)
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, t.o.MaxBackoff)
	}
}

// minRelist is the least time between two listings of an upstream.
const minRelist = time.Second

// upstream is one configured upstream as the tier serves it.
type upstream struct {
	t   *Tier
	cfg *Upstream
	log *slog.Logger
	sem chan struct{} // one per call in flight
	up  *atomic.Bool  // a session serves it (for the metrics)

	// state is what the calls see: the session serving the upstream, if
	// any, and whether one is coming. Only keep's goroutine changes it.
	state atomic.Pointer[serving]
	calls sync.WaitGroup // calls in flight
	// retiring counts the connections of ended sessions still open: each
	// is closed once the calls using it have ended.
	retiring sync.WaitGroup
	// admitting says whether onCall admits calls; admitMu orders it
	// with calls.Add, so that no call is added once a stopping tier
	// waits for them.
	admitMu   sync.Mutex
	admitting bool
	// sub is the subscription to the upstream's subject and rev the
	// revision of its record last written, kept from one session to the
	// next while the upstream is served; only keep's goroutine uses them.
	sub *nats.Subscription
	rev uint64
	// yielding says that a newer replica's record, listing the upstream
	// otherwise, is left alone (see put); vacated then delivers when that
	// record is gone, from a watch of it that stopWatch ends. Only keep's
	// goroutine uses them.
	yielding  bool
	vacated   chan struct{}
	stopWatch func()
	// renewed is when this replica last wrote the record, and lapse why
	// it does not renew it now (nil while it does): losing the lease is
	// logged once at warn with its reason, and getting it back once at
	// info, not every period. Only keep's goroutine uses them.
	renewed time.Time
	lapse   error
	// refused holds the tools already reported as unlistable, so a
	// re-list does not report them again; only the session uses it.
	refused map[string]bool
	// kick asks the session to list again: a call saw the upstream fail
	// in a way that may mean it is gone.
	kick chan struct{}
}

// serving is the upstream as the calls see it at one moment: served by a
// session, between two sessions (a call waits for the next), or down (no
// session is coming). changed is closed when it is replaced.
type serving struct {
	sv      *served // nil between sessions and when down
	down    bool
	changed chan struct{}
}

// served is one session's connection and allowed tools.
type served struct {
	conn  *conn
	tools map[string]bus.RemoteTool // by the upstream's own name
}

// setState replaces what the calls see and wakes those waiting for it.
func (s *upstream) setState(sv *served, down bool) {
	s.up.Store(sv != nil)
	old := s.state.Swap(&serving{sv: sv, down: down, changed: make(chan struct{})})
	close(old.changed)
}

// acquire returns the session to call the upstream on, its connection
// held for the call: the current one, unless it is last's and that
// connection has ended (a call to try again waits for the next session).
// It waits while the upstream is between sessions, and returns nil when
// the upstream is down or ctx ends first.
func (s *upstream) acquire(ctx context.Context, last *served) *served {
	for {
		st := s.state.Load()
		if sv := st.sv; sv != nil && (last == nil || sv.conn != last.conn || !sv.conn.dead()) && sv.conn.acquire() {
			return sv
		}
		if st.down {
			return nil
		}
		select {
		case <-st.changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// conn is one session's connection and the calls using it. Once retired
// (its session ended) it is held by no new call, and idle is closed when
// the last call using it releases it.
type conn struct {
	client Client
	// use counts the calls holding the connection, plus retiredBit once
	// it is retired: two atomic adds per call, no lock.
	use      atomic.Int64
	idle     chan struct{}
	idleOnce sync.Once
}

const retiredBit = 1 << 40

func newConn(c Client) *conn { return &conn{client: c, idle: make(chan struct{})} }

func (c *conn) acquire() bool {
	if c.use.Add(1)&retiredBit != 0 {
		c.release()
		return false
	}
	return true
}

func (c *conn) release() {
	if c.use.Add(-1) == retiredBit {
		c.idleOnce.Do(func() { close(c.idle) })
	}
}

func (c *conn) retire() {
	if c.use.Add(retiredBit) == retiredBit {
		c.idleOnce.Do(func() { close(c.idle) })
	}
}

// dead reports whether the connection is retired or has ended.
func (c *conn) dead() bool { return c.use.Load()&retiredBit != 0 || isClosed(c.client.Done()) }

// retire ends a session's connection: calls no longer take it, and it is
// closed (a stdio process reaped) once those using it have ended, while
// the next session starts.
func (s *upstream) retire(c *conn) {
	c.retire()
	s.retiring.Go(func() {
		<-c.idle
		if err := c.client.Close(); err != nil {
			s.log.Debug("close upstream", "err", err)
		}
	})
}

// session dials the upstream, lists it, and serves it until the
// connection ends, a re-list fails or ctx ends. It reports whether the
// upstream was served at all, and why the session ended (nil: ctx
// ended). The subscription and the record outlive it: keep ends them
// with leave when no session follows at once. The calls it admits run
// in calls (see keep).
func (s *upstream) session(ctx, calls context.Context) (bool, error) {
	t := s.t
	dctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	client, err := t.o.Dial(dctx, s.cfg, s.log)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("upstream unreachable; trying again", "err", scrub(err))
		}
		return false, fmt.Errorf("unreachable: %w", err)
	}
	rec, tools, err := s.list(ctx, client)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("upstream cannot be listed; trying again", "err", scrub(err))
		}
		if err := client.Close(); err != nil {
			s.log.Debug("close upstream", "err", err)
		}
		return false, fmt.Errorf("cannot be listed: %w", err)
	}
	c := newConn(client)
	defer s.retire(c) // after the calls see the session end, below
	s.setState(&served{conn: c, tools: tools}, false)
	defer s.setState(nil, false) // the calls wait for the next session

	if s.sub == nil {
		// Served before it is listed: a gateway that sees the record
		// finds a responder (as the device tier flushes its
		// subscription first).
		s.setAdmitting(true)
		sub, err := t.o.NC.QueueSubscribe(bus.RemoteCall(s.cfg.Name), bus.QueueRemote, func(m *nats.Msg) { s.onCall(calls, m) })
		if err == nil {
			err = t.o.NC.FlushTimeout(5 * time.Second)
		}
		if err != nil {
			s.log.Error("subscribe upstream subject", "err", err)
			if sub != nil {
				_ = sub.Unsubscribe()
			}
			s.setAdmitting(false)
			return false, fmt.Errorf("subscribe its subject: %w", err)
		}
		s.sub = sub
	}
	defer s.unwatch()
	if s.put(ctx, rec) {
		s.log.Info("upstream listed", "tools", len(rec.Tools), "tenants", rec.Tenants)
	}

	lease := time.NewTicker(t.o.Remotes.TTL() / 3)
	defer lease.Stop()
	relist := time.NewTicker(s.cfg.Refresh)
	defer relist.Stop()
	// A re-list asked for within minRelist of the last waits for its end:
	// an upstream that says list_changed in bursts is listed once a
	// second at most.
	lastList := time.Now()
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	var pending bool
	for {
		var changed, put bool
		select {
		case <-ctx.Done():
			return true, nil
		case <-client.Done():
			s.log.Warn("upstream connection ended; connecting again")
			return true, errors.New("its connection ended")
		case <-lease.C:
			// The lease says the upstream is served: it is renewed
			// only while the upstream answers. An HTTP upstream that
			// died while nothing called it is found out here, not when
			// the MCP client gives its event stream up, tens of seconds
			// later; a re-list decides.
			err := s.answers(ctx, client)
			if ctx.Err() != nil {
				return true, nil
			}
			if err != nil {
				s.lapsing(fmt.Errorf("it does not answer: %w", err))
				changed = true
			} else {
				put = true
			}
		case <-client.Changed():
			changed = true
		case <-relist.C:
			changed = true
		case <-s.kick:
			changed = true
		case <-due.C:
			pending, changed = false, true
		case <-s.vacated:
			put = true
		}
		if changed && time.Since(lastList) < minRelist {
			if !pending {
				pending = true
				due.Reset(minRelist - time.Since(lastList))
			}
			changed = false
		}
		if changed {
			next, tools, err := s.list(ctx, client)
			lastList = time.Now()
			if err != nil {
				if ctx.Err() != nil {
					return true, nil
				}
				s.log.Warn("upstream cannot be listed; connecting again", "err", scrub(err))
				return true, fmt.Errorf("cannot be listed: %w", err)
			}
			if next.Digest != rec.Digest {
				if left := toolsLeft(rec, next); len(left) > 0 {
					s.log.Warn("upstream's tools leave every list: it lists them no more, or they were refused", "left", left)
				}
				s.log.Info("upstream's tools changed", "tools", len(next.Tools))
				put = true
			}
			rec = next
			s.setState(&served{conn: c, tools: tools}, false)
		}
		if !put {
			continue // the record is as written, and its lease not yet due
		}
		s.put(ctx, rec)
	}
}

// toolsLeft returns the names of the tools of old that next lists no
// more.
func toolsLeft(old, next *bus.Remote) []string {
	var left []string
	for _, tl := range old.Tools {
		if !slices.ContainsFunc(next.Tools, func(n bus.RemoteTool) bool { return n.Name == tl.Name }) {
			left = append(left, tl.Name)
		}
	}
	return left
}

// put writes the upstream's record and reports whether it did. Where a
// replica started after this one lists the upstream otherwise (a config
// being rolled out), its record is left alone, so that the two do not
// replace each other's on every refresh and send every gateway's
// sessions tools/list_changed each time: the newer config wins, as the
// rollout means it to. This replica says so once, keeps serving calls,
// and writes again as soon as that record is gone (its replica stopped,
// or could no longer list the upstream), or lists it as this one does.
func (s *upstream) put(ctx context.Context, rec *bus.Remote) bool {
	rev, err := s.t.o.Remotes.Put(ctx, rec)
	switch {
	case errors.Is(err, bus.ErrNewerReplica):
		if !s.yielding {
			s.yielding = true
			s.log.Warn("a newer replica's list is served; this replica's config differs", "err", err)
		}
		s.watch(ctx)
		return false
	case err != nil:
		if ctx.Err() == nil {
			s.lapsing(fmt.Errorf("its record cannot be written: %w", err))
		}
		return false
	}
	s.rev = rev
	s.renew()
	s.unwatch()
	if s.yielding {
		s.yielding = false
		s.log.Info("this replica's list is served again")
	}
	return true
}

// watch watches the newer replica's record, if it does not yet, until
// unwatch: vacated delivers when the record is gone.
func (s *upstream) watch(ctx context.Context) {
	if s.stopWatch != nil {
		return
	}
	vacated := make(chan struct{}, 1)
	gone := func() {
		select {
		case vacated <- struct{}{}:
		default:
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var live bool
		err := s.t.o.Remotes.WatchUpstream(wctx, s.cfg.Name, func(ev bus.RemoteEvent) {
			if ev.Upstream != s.cfg.Name {
				return
			}
			live = ev.Remote != nil
			if !live {
				gone()
			}
		}, func() {
			if !live { // gone already
				gone()
			}
		})
		if wctx.Err() == nil {
			// The lease's refresh checks the record still.
			s.log.Warn("watch upstream record", "err", err)
		}
	}()
	s.vacated, s.stopWatch = vacated, func() { cancel(); <-done }
}

func (s *upstream) unwatch() {
	if s.stopWatch != nil {
		s.stopWatch()
		s.vacated, s.stopWatch = nil, nil
	}
}

// leave stops serving the upstream: the calls waiting for a session are
// answered, calls go to the other replicas from now, and an upstream
// this replica can no longer list (why) is removed, unless another
// replica serves it. A replica that stops leaves the record to expire:
// another replica that serves the upstream keeps it, with no gap; its
// calls in flight have StopGrace to end, then endCalls ends them. Either
// way, tools that leave every list are logged once, at warn, with the
// reason.
func (s *upstream) leave(ctx context.Context, why error, endCalls func()) {
	s.setState(nil, true)
	if s.sub != nil {
		if err := s.sub.Unsubscribe(); err != nil {
			s.log.Warn("unsubscribe upstream subject", "err", err)
		}
		s.sub = nil
		s.setAdmitting(false)
	}
	rev := s.rev
	s.rev, s.lapse = 0, nil
	if ctx.Err() != nil { // the tier stops: a grace, then the calls end
		if rev != 0 {
			s.stopped()
		}
		grace := time.AfterFunc(s.t.o.StopGrace, endCalls)
		defer grace.Stop()
		s.calls.Wait()
		return
	}
	if rev == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s.servedElsewhere(rctx) {
		s.log.Info("another replica serves the upstream: its record stays")
		return
	}
	if why == nil {
		why = errors.New("it is no longer served")
	}
	if err := s.t.o.Remotes.Release(rctx, s.cfg.Name, rev); err != nil {
		s.log.Warn("upstream's record cannot be removed: its tools leave every list when its lease lapses",
			"err", err, "reason", scrub(why), "lapses_in", s.lapsesIn())
		return
	}
	s.log.Warn("upstream's record removed: its tools leave every list until it is listed again", "err", scrub(why))
}

// stopped says, as the tier stops, whether the upstream's tools stay
// listed: only when another replica serves it.
func (s *upstream) stopped() {
	rctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if s.servedElsewhere(rctx) {
		s.log.Info("the tier stops; another replica serves the upstream")
		return
	}
	s.log.Info("the tier stops and no other replica serves the upstream: its tools leave every list when its lease lapses",
		"lapses_in", s.lapsesIn())
}

// lapsing says, once until the record is renewed again, that this
// replica does not renew the upstream's record, and why: unless another
// replica renews it, the record lapses within the lease and the
// upstream's tools leave every list.
func (s *upstream) lapsing(why error) {
	if s.lapse == nil {
		s.log.Warn("upstream's lease is not renewed: unless another replica renews it, its tools leave every list when it lapses",
			"err", scrub(why), "lapses_in", s.lapsesIn())
	}
	s.lapse = why
}

// renew notes that the record was written now, and says so once when it
// had not been renewed.
func (s *upstream) renew() {
	if s.lapse != nil {
		s.log.Info("upstream's lease is renewed again", "was", scrub(s.lapse), "unrenewed_for", time.Since(s.renewed).Round(time.Millisecond))
		s.lapse = nil
	}
	s.renewed = time.Now()
}

// lapsesIn is how long the record this replica last wrote has left.
func (s *upstream) lapsesIn() time.Duration {
	return max(s.t.o.Remotes.TTL()-time.Since(s.renewed), 0).Round(time.Millisecond)
}

// pinger is a [Client] that can ask its upstream whether it is there.
type pinger interface {
	Ping(ctx context.Context) error
}

// answers returns nil when the upstream answers a ping within a third of
// the lease (or its timeout, when shorter), or its client needs none (an
// action endpoint has no connection to lose), and why not otherwise.
// Any JSON-RPC answer counts, an error object too ([mcpClient.Ping]):
// the revision 2026-07-28 has no ping.
func (s *upstream) answers(ctx context.Context, client Client) error {
	p, ok := client.(pinger)
	if !ok {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, min(s.t.o.Remotes.TTL()/3, s.cfg.Timeout))
	defer cancel()
	return p.Ping(pctx)
}

// servedElsewhere reports whether another replica answers the
// upstream's subject (this one has left it): then the record is theirs
// to keep, and removing it would take the tools off every list for up to
// a third of the lease.
func (s *upstream) servedElsewhere(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	probe := &nats.Msg{Subject: bus.RemoteCall(s.cfg.Name), Header: nats.Header{bus.HeaderProbe: {"1"}}}
	_, err := s.t.o.NC.RequestMsgWithContext(pctx, probe)
	return err == nil
}

func (s *upstream) setAdmitting(on bool) {
	s.admitMu.Lock()
	s.admitting = on
	s.admitMu.Unlock()
}

// list lists the upstream's tools and keeps those the config allows and
// okso can list, as the record to write and by name.
func (s *upstream) list(ctx context.Context, client Client) (*bus.Remote, map[string]bus.RemoteTool, error) {
	lctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	listed, err := client.List(lctx)
	if err != nil {
		return nil, nil, err
	}
	rec := &bus.Remote{
		Upstream:      s.cfg.Name,
		Transport:     s.cfg.Transport,
		Tenants:       s.cfg.Tenants,
		TimeoutMs:     s.cfg.Timeout.Milliseconds(),
		Writer:        s.t.o.Replica,
		WriterStarted: s.t.started,
	}
	tools := map[string]bus.RemoteTool{}
	for _, tl := range listed {
		if !s.cfg.Allowed(tl.Name) {
			continue
		}
		rt, err := s.project(tl)
		if err == nil && tools[tl.Name].Name != "" {
			err = errors.New("the upstream lists it twice")
		}
		if err != nil {
			s.refuse(tl.Name, err)
			continue
		}
		tools[tl.Name] = rt
		rec.Tools = append(rec.Tools, rt)
	}
	if err := rec.Seal(); err != nil {
		return nil, nil, err
	}
	// The record travels as one NATS message.
	if b, err := json.Marshal(rec); err != nil {
		return nil, nil, err
	} else if max := s.t.o.NC.MaxPayload(); int64(len(b)) > max {
		return nil, nil, fmt.Errorf("the allowed tools make a record of %d bytes, over the %d NATS carries: allow fewer", len(b), max)
	}
	return rec, tools, nil
}

// project checks one allowed tool and classes it as the config says.
func (s *upstream) project(tl Tool) (bus.RemoteTool, error) {
	if _, err := schemas.RemoteToolName(s.cfg.Name, tl.Name); err != nil {
		return bus.RemoteTool{}, err
	}
	if err := schemas.ValidToolSchema(tl.InputSchema); err != nil {
		return bus.RemoteTool{}, err
	}
	if _, err := schemas.CompileForeign(tl.InputSchema); err != nil {
		return bus.RemoteTool{}, fmt.Errorf("input %w", err)
	}
	if len(tl.OutputSchema) > 0 {
		if _, err := schemas.CompileForeign(tl.OutputSchema); err != nil {
			return bus.RemoteTool{}, fmt.Errorf("output %w", err)
		}
	}
	safety := s.cfg.SafetyOf(tl.Name)
	if safety == "" {
		return bus.RemoteTool{}, errors.New("no safety class for it in the config")
	}
	return bus.RemoteTool{
		Name:         tl.Name,
		Title:        schemas.TrimDescription(tl.Title),
		Description:  schemas.TrimDescription(tl.Description),
		InputSchema:  tl.InputSchema,
		OutputSchema: tl.OutputSchema,
		Safety:       safety,
		Idempotent:   s.cfg.IsIdempotent(tl.Name),
	}, nil
}

// refuse logs and audits, once per tool, an allowed tool
// that cannot be listed (DESIGN.md §8: refused where it is declared,
// never truncated).
func (s *upstream) refuse(tool string, err error) {
	if s.refused == nil {
		s.refused = map[string]bool{}
	}
	if s.refused[tool] {
		return
	}
	s.refused[tool] = true
	s.log.Warn("allowed tool not listed", "tool", printable(tool), "err", err)
	s.t.o.Auditor.Record(bus.AuditEvent{Actor: "remote", Upstream: s.cfg.Name,
		Decision: bus.DecisionInvalid, Code: schemas.CodeManifestInvalid})
}
