// Package agent is the device end of okso.v1: a [Device] dials a device
// tier, authenticates, announces its capabilities, and answers their cmds
// with [Handler]s until its context ends, reconnecting after a loss. It
// also holds what okso's own devices run: the system.echo handler,
// system.metrics measured by a [HostSampler] (okso agent) or a
// [MockSampler] (okso mock-fleet), and a simulated GPIO pin.
//
// Start from [HostOptions] or [MockOptions] for one of okso's devices, or
// fill [Options] for your own, then run it:
//
//	o := agent.MockOptions(wire.NewNodeID(), set, 1)
//	o.URLs, o.Token = []string{"ws://tier:7443" + wire.Path}, token
//	d, err := agent.New(o)
//	...
//	err = d.Run(ctx) // nil when ctx ends; a *CloseError if a tier refused the device for good
//
// agent speaks the protocol through package wire and never imports the
// device tier, not even in its tests, which play the tier by hand: the
// two meet only on a socket (their tests together are in device/e2e). It
// imports bus only for the contract's vocabulary that still lives there
// (the manifest types, the node id and tool name rules, the error codes);
// it never touches NATS.
package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/device/internal/workers"
	"github.com/okso-io/okso/device/internal/wsframe"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/rawio"
	"github.com/okso-io/okso/schemas"
)

// Handler answers one verb of one capability. args has passed the verb's
// input schema. The result is sent as cmd_ack.payload.result; an error
// becomes cmd_ack.payload.error (a *schemas.Error keeps its code).
type Handler func(ctx context.Context, args json.RawMessage) (any, error)

// StreamHandler serves one streaming verb: it calls emit with each frame
// until ctx ends (the tier cancelled the stream, or the device is
// stopping). args has passed the verb's input schema. Returning on its own
// ends the stream.
type StreamHandler func(ctx context.Context, args json.RawMessage, emit func(frame any) error) error

// Options configure a [Device]. URLs, Token, NodeID, Capabilities, Handlers
// and Schemas are required.
type Options struct {
	// URLs of device tiers (ws://host:port/v1/device/ws, or wss://),
	// tried in turn.
	URLs []string
	// TLS is the client config of wss:// URLs (nil: the system's roots).
	TLS *tls.Config
	// HTTPClient, if set, makes the dials (and TLS is its transport's to
	// set): devices may share one, such as a fleet dialling from one
	// source address.
	HTTPClient *http.Client
	Token      string
	NodeID     string
	Agent      schemas.Agent
	// Name and Labels are announced to a tier that takes the feature
	// labels, and left out for one that does not (an older tier would
	// refuse the announce). Name must be a valid node name
	// ([schemas.ValidNodeName]) or ""; Labels must pass
	// [schemas.CheckLabels]. The operator's labels, from the token or
	// the tier, win over these.
	Name         string
	Labels       map[string]string
	Capabilities []schemas.Capability
	// Handlers and Streams by "cap_id.verb".
	Handlers map[string]Handler
	Streams  map[string]StreamHandler
	Schemas  *schemas.Set
	Logger   *slog.Logger
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// connection attempts (1 s, 30 s).
	MinBackoff, MaxBackoff time.Duration
	// OnReady, if set, is called after each accepted announce with the
	// projected tool names.
	OnReady func(tools []string)
	// OnLost, if set, is called when a connection that got as far as
	// OnReady ends while the device is still running (the tier went away,
	// closed the session, or the link broke), with the reason, before
	// the device waits to reconnect. OnReady and OnLost are called in
	// turn from the goroutine of Run, never at once.
	OnLost func(err error)
	// OnFail, if set, is called after each connection attempt that did
	// not get as far as OnReady (the tier unreachable, the upgrade or the
	// handshake refused), with why, before the device waits to try again;
	// not for a refusal for good, which Run returns. It is called from the
	// goroutine of Run, in turn with OnReady and OnLost.
	OnFail func(err error)
	// PingInterval is how long the device may send nothing before it
	// sends a heartbeat (30 s): an unsolicited pong with no payload (RFC
	// 6455 §5.5.3), which keeps the connection and the NATs and proxies
	// on its path awake, and which the tier hears without answering. A
	// ping costs the tier a write and a pong back; a heartbeat only a
	// read, and an idle device's keepalive is most of what it costs its
	// tier. To know the tier is still there, the device pings a tier it
	// heard nothing from (no frame, ping or pong) for probeBeats
	// intervals; a tier that does not answer within the next interval is
	// dropped, so a connection that died without a close (a crashed host,
	// a NAT that forgot it) is noticed and replaced. A tier that pings
	// more often is never pinged. When the dial gives the device no
	// connection it can write a heartbeat to (an HTTPClient whose
	// transport hides it), it pings a tier silent for one interval
	// instead. A device that sets its own HTTPClient should dial with
	// [NewDialer].
	PingInterval time.Duration

	// quick names the handlers, by "cap_id.verb", that this package made
	// and knows to return at once without blocking (see [quickHandler]),
	// each with its function's identity: a cmd for one is answered on the
	// connection's reading goroutine rather than handed to a worker. A
	// handler put in its place is not quick.
	quick map[string]uintptr
}

// probeBeats is how many ping intervals of its tier's silence a device
// that sends heartbeats waits before it pings the tier (see
// [Options.PingInterval]).
const probeBeats = 4

// Device is the device end of the protocol: it dials a tier, authenticates,
// announces its capabilities and answers cmds until its context ends,
// reconnecting after a loss. Make one with [New]; it is safe to Run once.
type Device struct {
	o      Options
	log    *slog.Logger
	client *http.Client // of the dials, through a wsframe.Transport
}

// CloseError is returned by [Device.Run] when a tier refused the device for
// good (authentication, authorization, protocol, or a newer session).
type CloseError struct {
	Code   int
	Reason string
}

func (e *CloseError) Error() string {
	if m := wire.CloseMeaning(e.Code); m != "" {
		return fmt.Sprintf("device tier closed the session with %d (%s): %s", e.Code, m, e.Reason)
	}
	return fmt.Sprintf("device tier closed the session with %d: %s", e.Code, e.Reason)
}

// New checks o and returns a device ready to [Device.Run].
func New(o Options) (*Device, error) {
	if len(o.URLs) == 0 || o.Token == "" || !schemas.ValidNodeID(o.NodeID) || o.Schemas == nil {
		return nil, errors.New("device agent: URLs, Token, a valid NodeID and Schemas are required")
	}
	if o.Name != "" && !schemas.ValidNodeName(o.Name) {
		return nil, fmt.Errorf("device agent: name %q is not ^[a-z0-9][a-z0-9.-]{0,62}$", o.Name)
	}
	if err := schemas.CheckLabels(o.Labels); err != nil {
		return nil, fmt.Errorf("device agent: %w", err)
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.Agent.Name == "" {
		o.Agent = schemas.Agent{Name: "okso", Version: "dev"}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Device{o: o, log: log.With("node_id", o.NodeID), client: o.HTTPClient}
	if d.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DialContext = rawio.Dial(NewDialer(o.PingInterval))
		t.TLSClientConfig = o.TLS
		d.client = &http.Client{Transport: t}
	}
	d.client = wsframe.Client(d.client)
	return d, nil
}

// NodeID returns the device's node id.
func (d *Device) NodeID() string { return d.o.NodeID }

// Run connects and serves until ctx ends (then it returns nil) or a tier
// refuses the device for good (a *CloseError).
func (d *Device) Run(ctx context.Context) error {
	backoff := d.o.MinBackoff
	// Start at a random tier, so a fleet given the same URLs spreads over
	// them; after a loss, try the next.
	for i := rand.N(len(d.o.URLs)); ; i++ {
		url := d.o.URLs[i%len(d.o.URLs)]
		ready, err := d.session(ctx, url)
		if ctx.Err() != nil {
			return nil
		}
		if ready && d.o.OnLost != nil {
			d.o.OnLost(err)
		}
		var ce *CloseError
		if errors.As(err, &ce) {
			return err
		}
		if !ready && d.o.OnFail != nil {
			d.o.OnFail(err)
		}
		if ready {
			backoff = d.o.MinBackoff
		}
		var wce websocket.CloseError
		switch {
		case errors.As(err, &wce) && wce.Code == wire.CloseReplaced:
			// Another connection took this node: leave it alone a while.
			backoff = d.o.MaxBackoff
		case errors.As(err, &wce) && wce.Code == wire.CloseGoingAway:
			// The tier is going away (or could not register the node):
			// another tier, soon.
			backoff = d.o.MinBackoff
		}
		d.log.Debug("device session ended", "url", url, "err", err)
		// Full jitter: a fleet dropped at once (a tier's 1001) comes back
		// spread over the whole backoff, not in one wave.
		wait := time.Millisecond + rand.N(backoff)
		backoff = min(backoff*2, d.o.MaxBackoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// permanent reports whether a close code means "do not come back".
func permanent(code websocket.StatusCode) bool {
	switch code {
	case wire.CloseMalformed, wire.CloseAuthFailed, wire.CloseForbidden, wire.CloseTooLarge:
		return true
	}
	return false
}

// conn wraps one connection of a device.
type conn struct {
	d      *Device
	c      *websocket.Conn
	writes *wire.WriteGuard
	clock  tierClock     // the zero value when the tier sent no clock
	heard  *heard        // when the tier was last heard from
	beat   *wsframe.Body // what the library writes to; nil: no heartbeats, pings
	// maxFrame is the largest frame the tier reads (hello's
	// max_frame_bytes): a result that would make a larger cmd_ack is cut
	// to fit when it can be ([fitter]), and an error otherwise.
	maxFrame int
	// debug: the device's log takes debug lines (its level is set once,
	// so it is asked once per connection rather than once per cmd).
	debug bool
	// frame holds the last frame read, its memory reused for the next:
	// what a frame's envelope shares with it (its payload, a cmd's
	// arguments) is good until the next recv.
	frame bytes.Buffer
}

// maxKeptFrame bounds the frame buffer a connection keeps between reads:
// a larger frame's is let go.
const maxKeptFrame = 64 << 10

// heard is when a connection last heard from its tier: any frame, a ping
// of the tier's or a pong, on the monotonic clock. It is safe for
// concurrent use.
type heard struct {
	epoch time.Time
	last  atomic.Int64 // since epoch
}

func newHeard() *heard { return &heard{epoch: time.Now()} }

func (h *heard) now()                              { h.last.Store(int64(time.Since(h.epoch))) }
func (h *heard) ping(context.Context, []byte) bool { h.now(); return true }
func (h *heard) pong(context.Context, []byte)      { h.now() }
func (h *heard) silent() time.Duration             { return time.Since(h.epoch) - time.Duration(h.last.Load()) }

// tierClock is the device's reckoning of its tier's clock: the tier's
// time at auth_ok, and when auth_ok arrived on the device's monotonic
// clock, which steps of the device's wall clock (an RTC-less board
// setting its time after boot) do not move.
type tierClock struct {
	ms int64     // the tier's clock at auth_ok, Unix milliseconds
	at time.Time // when auth_ok arrived
}

// clockSlack is how far past a cmd's deadline_at_ms, by the device's
// reckoning of the tier's clock, a cmd still starts: the reckoning's
// rounding, plus 100 ppm of the time since auth_ok for the two hosts'
// clocks running at slightly different rates. The reckoning is late by
// auth_ok's transit, which errs the same, safe, way.
func clockSlack(sinceSync time.Duration) time.Duration {
	return 10*time.Millisecond + sinceSync/10000
}

// left returns how long a cmd whose deadline is deadlineAtMs on the
// tier's clock may still run, slack included; zero or less means its
// deadline has passed and it must not start.
func (k tierClock) left(now time.Time, deadlineAtMs int64) time.Duration {
	since := now.Sub(k.at)
	tierNow := k.ms + since.Milliseconds()
	return time.Duration(deadlineAtMs-tierNow)*time.Millisecond + clockSlack(since)
}

// writeTimeout bounds a stalled write: the connection closes, and the
// device reconnects.
const writeTimeout = 5 * time.Second

func (c *conn) send(ctx context.Context, typ, inReplyTo string, payload any) error {
	b, err := wire.Encode(typ, inReplyTo, payload)
	if err != nil {
		return err
	}
	c.writes.Begin()
	err = c.c.Write(ctx, websocket.MessageText, b)
	c.writes.End(err == nil)
	return err
}

// recv reads the next frame. A frame the protocol refuses (binary, not
// an envelope its schema accepts, or not of the type wanted) ends the
// connection with 4400, as the tier ends one for such a frame of the
// device's. The envelope's payload is good until the next recv (see
// conn.frame).
func (c *conn) recv(ctx context.Context, want string) (wire.Envelope, error) {
	typ, b, err := c.read(ctx)
	if err != nil {
		return wire.Envelope{}, closeErr(err)
	}
	c.heard.now()
	if typ != websocket.MessageText {
		return wire.Envelope{}, c.refuse(errors.New("tier sent a binary frame"))
	}
	e, err := wire.DecodeEnvelope(c.d.o.Schemas, b)
	if err != nil {
		return wire.Envelope{}, c.refuse(fmt.Errorf("tier sent a frame: %w", err))
	}
	if e.Type == wire.TypeError {
		var ef wire.ErrorFrame
		_ = json.Unmarshal(e.Payload, &ef) // the schema checked it
		// The close that follows carries the code; read it.
		if _, _, err := c.c.Read(ctx); err != nil {
			err = closeErr(err)
			var ce *CloseError
			if errors.As(err, &ce) && ce.Code == wire.CloseAuthFailed && ef.Code == schemas.CodeDeadlineExceeded {
				// Late, not refused: the tier found the device too slow
				// to authenticate or announce, which a loaded tier or a
				// slow link can make it. Another try may be on time.
				return wire.Envelope{}, fmt.Errorf("device tier closed the connection with %d (%s): %s", ce.Code,
					wire.CloseMeaning(ce.Code), ce.Reason)
			}
			return wire.Envelope{}, err
		}
		return wire.Envelope{}, errors.New("tier sent an error frame without closing")
	}
	if want != "" && e.Type != want {
		return wire.Envelope{}, c.refuse(fmt.Errorf("tier sent %s, want %s", e.Type, want))
	}
	return e, nil
}

// read reads the next frame whole into c.frame, as the WebSocket
// library's Read would into a fresh buffer.
func (c *conn) read(ctx context.Context) (websocket.MessageType, []byte, error) {
	typ, r, err := c.c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	c.frame.Reset()
	if _, err := c.frame.ReadFrom(r); err != nil {
		return 0, nil, err
	}
	b := c.frame.Bytes()
	if c.frame.Cap() > maxKeptFrame {
		c.frame = bytes.Buffer{} // b stays good: it is let go, not reused
	}
	return typ, b, nil
}

// refuse closes the connection with 4400 for a frame of the tier's that
// the protocol refuses, and returns err, which says what it was.
func (c *conn) refuse(err error) error {
	if cerr := c.c.Close(wire.CloseMalformed, "malformed or unexpected frame"); cerr != nil {
		c.d.log.Debug("close the connection after a refused frame", "err", cerr)
	}
	return err
}

func closeErr(err error) error {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return err
	}
	if permanent(ce.Code) {
		return &CloseError{Code: int(ce.Code), Reason: ce.Reason}
	}
	if m := wire.CloseMeaning(int(ce.Code)); m != "" {
		return fmt.Errorf("device tier closed the connection with %d (%s): %w", ce.Code, m, err)
	}
	return err
}

// session runs one connection; ready reports whether it got as far as
// announce_ok.
func (d *Device) session(ctx context.Context, url string) (ready bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	dctx, beat := wsframe.WithBody(dctx)
	h := newHeard()
	c, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}, HTTPClient: d.client,
		OnPingReceived: h.ping, OnPongReceived: h.pong})
	cancel()
	if err != nil {
		return false, fmt.Errorf("dial device tier %s: %w", url, err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	cn := &conn{d: d, c: c, heard: h, beat: *beat, debug: d.log.Enabled(ctx, slog.LevelDebug), writes: wire.NewWriteGuard(writeTimeout, func() {
		// The tier stopped reading: the writes fail, the session ends, and
		// Run reconnects.
		d.log.Info("the device tier stalled a write: connection dropped", "url", url, "err", c.CloseNow())
	})}

	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e, err := cn.recv(hctx, wire.TypeHello)
	if err != nil {
		return false, err
	}
	var hello wire.Hello
	if json.Unmarshal(e.Payload, &hello) == nil && hello.MaxFrameBytes > 0 {
		cn.maxFrame = hello.MaxFrameBytes
	} else {
		cn.maxFrame = wire.DefaultMaxFrameBytes
	}
	if err := cn.send(hctx, wire.TypeAuth, "", wire.Auth{Token: d.o.Token}); err != nil {
		return false, err
	}
	if e, err = cn.recv(hctx, wire.TypeAuthOK); err != nil {
		return false, err
	}
	announce := wire.Announce{NodeID: d.o.NodeID, Agent: d.o.Agent, Capabilities: d.o.Capabilities}
	// Leniently: only the clock and the features matter here, and a
	// newer tier may say more.
	var ok struct {
		ServerTimeMs int64    `json:"server_time_ms"`
		Features     []string `json:"features"`
	}
	if json.Unmarshal(e.Payload, &ok) == nil && ok.ServerTimeMs > 0 {
		// A tier that sends its clock takes the features that need it; an
		// older one would refuse an announce that names any.
		cn.clock = tierClock{ms: ok.ServerTimeMs, at: time.Now()}
		announce.Features = []string{wire.FeatureDeadlineAt}
		// Name and labels go only to a tier that says it takes them.
		if slices.Contains(ok.Features, wire.FeatureLabels) && (d.o.Name != "" || len(d.o.Labels) > 0) {
			announce.Features = append(announce.Features, wire.FeatureLabels)
			announce.Name, announce.Labels = d.o.Name, d.o.Labels
		}
		// The call's trace context, in each cmd, from a tier that offers it.
		if slices.Contains(ok.Features, wire.FeatureTrace) {
			announce.Features = append(announce.Features, wire.FeatureTrace)
		}
	}
	if !slices.Contains(ok.Features, wire.FeatureLocalTools) {
		// An older tier would refuse the whole manifest: it gets the rest.
		// (Nor does it know registered kinds.)
		announce.Capabilities = slices.DeleteFunc(slices.Clone(announce.Capabilities), func(c schemas.Capability) bool {
			return c.Kind == schemas.KindLocal || !schemas.IsBuiltinKind(c.Kind)
		})
		if n := len(d.o.Capabilities) - len(announce.Capabilities); n > 0 {
			d.log.Warn("the device tier does not take local tools: they are not announced", "url", url, "local_tools", n)
		}
	}
	if err := cn.send(hctx, wire.TypeAnnounce, "", announce); err != nil {
		return false, err
	}
	if e, err = cn.recv(hctx, wire.TypeAnnounceOK); err != nil {
		return false, err
	}
	var announced wire.AnnounceOK
	if err := wire.DecodePayload(e, &announced); err != nil {
		return false, err
	}
	cancel()
	tools := d.toolTable(announced.Tools)
	if d.o.OnReady != nil {
		d.o.OnReady(announced.Tools)
	}
	return true, cn.serve(ctx, tools)
}

// A tool is what the device needs to serve one of its projected tools.
type tool struct {
	h    Handler
	sh   StreamHandler
	verb schemas.Verb // the zero Verb when the capability's kind has none of that name
	// registered: the capability's kind is an operator's, whose schemas
	// the agent has not got: the gateway checked the arguments.
	registered bool
	// quick: h is one of this package's handlers that return at once
	// (Options.quick), answered on the reading goroutine.
	quick bool
}

// toolTable looks up, once per connection, the handler and the verb of
// each tool the tier projected; a tool the device has no handler for is
// left out (a cmd for it is E_TOOL_NOT_FOUND).
func (d *Device) toolTable(projected []string) map[string]*tool {
	tools := make(map[string]*tool, len(projected))
	for _, name := range projected {
		n, ok := schemas.ParseToolName(name)
		key := n.CapID + "." + n.Verb
		h, sh := d.o.Handlers[key], d.o.Streams[key]
		if !ok || (h == nil && sh == nil) {
			continue
		}
		t := &tool{h: h, sh: sh}
		if pc, ok := d.o.quick[key]; ok && h != nil && sh == nil && reflect.ValueOf(h).Pointer() == pc {
			t.quick = true
		}
		for _, cp := range d.o.Capabilities {
			if cp.CapID == n.CapID {
				if k, ok := schemas.LookupKind(cp.Kind); ok {
					t.verb, _ = k.Verb(n.Verb)
				} else if slices.Contains(cp.Verbs, n.Verb) {
					t.verb, t.registered = schemas.Verb{Name: n.Verb}, true
				}
			}
		}
		tools[name] = t
	}
	return tools
}

// serve answers cmds until the connection or ctx ends.
func (c *conn) serve(ctx context.Context, tools map[string]*tool) error {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		cancels = map[string]context.CancelFunc{}
	)
	defer wg.Wait()
	// Each cmd runs on a worker; one stays warm between calls.
	w := workers.New(1)
	defer w.Close()
	// When ctx ends, the connection closes normally, which ends the read
	// below; the close is waited for if it has begun.
	closing := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closing)
		if err := c.c.Close(websocket.StatusNormalClosure, "device shutting down"); err != nil {
			c.d.log.Debug("close the connection to the device tier", "err", err)
		}
	})
	defer func() {
		if !stop() {
			<-closing
		}
	}()
	pingDone := make(chan struct{})
	defer close(pingDone)
	// The device sends a heartbeat after an interval of its own silence,
	// and pings a tier silent for probeBeats intervals, or for one
	// without heartbeats (see Options.PingInterval).
	wg.Go(func() {
		every := c.d.o.PingInterval
		probe := every
		if c.beat != nil {
			probe = probeBeats * every
		}
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-pingDone:
				return
			case <-t.C:
			}
			if c.heard.silent() >= probe {
				pctx, cancel := context.WithTimeout(ctx, every)
				err := c.c.Ping(pctx)
				cancel()
				if err != nil {
					// The read below fails; Run reconnects.
					c.d.log.Debug("the device tier missed a ping: connection dropped", "err", err, "close", c.c.CloseNow())
					return
				}
			}
			next := probe - c.heard.silent()
			if c.beat != nil {
				if c.beat.Silent() >= every {
					c.writes.Begin()
					err := c.beat.Beat()
					c.writes.End(err == nil)
					if err != nil {
						c.d.log.Debug("heartbeat to the device tier", "err", err, "close", c.c.CloseNow())
						return
					}
				}
				next = min(next, every-c.beat.Silent())
			}
			t.Reset(max(next, every/64))
		}
	})
	// The read takes ctx without its end: a read whose context ends drops
	// the connection without a close; ctx's end closes it properly above.
	rctx := context.WithoutCancel(ctx)
	for {
		e, err := c.recv(rctx, "")
		if err == nil {
			switch e.Type {
			case wire.TypeCmd:
				var cmd wire.Cmd
				derr := wire.DecodePayload(e, &cmd)
				if t := tools[cmd.Tool]; derr == nil && t != nil && t.quick {
					// A handler that returns at once is answered here, with
					// no hand-off to a worker and back: nothing it does
					// could wait on a frame this goroutine would read
					// meanwhile (no cancel can reach it in time).
					c.handle(ctx, rctx, e, cmd, nil, tools)
					continue
				}
				// The worker runs after the next frame is read into
				// the memory the arguments share.
				cmd.Arguments = bytes.Clone(cmd.Arguments)
				hctx, cancel := context.WithCancel(ctx)
				mu.Lock()
				cancels[e.MsgID] = cancel
				mu.Unlock()
				wg.Add(1)
				w.Run(func() {
					defer wg.Done()
					c.handle(hctx, rctx, e, cmd, derr, tools)
					mu.Lock()
					delete(cancels, e.MsgID)
					mu.Unlock()
					cancel()
				})
				// Let the worker answer before this goroutine reads on: on one
				// P it would otherwise try the socket (a syscall, then a park)
				// while the cmd waits.
				runtime.Gosched()
				continue
			case wire.TypeCancel:
				mu.Lock()
				if cancel := cancels[e.InReplyTo]; cancel != nil {
					cancel()
				}
				mu.Unlock()
				continue
			}
			// After announce_ok a tier sends cmd, cancel and error only.
			err = c.refuse(fmt.Errorf("tier sent an unexpected %s frame", e.Type))
		}
		mu.Lock()
		for _, cancel := range cancels {
			cancel()
		}
		mu.Unlock()
		return err
	}
}

// handle runs the cmd e, whose payload decoded to cmd (or failed to with
// decodeErr), until ctx ends and answers it on wctx, a context of the
// connection that nothing cancels: not ctx itself, which a cancel may end
// mid-write, and the WebSocket library would then drop the whole
// connection.
func (c *conn) handle(ctx, wctx context.Context, e wire.Envelope, cmd wire.Cmd, decodeErr error, tools map[string]*tool) {
	ack := func(a wire.CmdAck) {
		if err := c.send(wctx, wire.TypeCmdAck, e.MsgID, a); err != nil {
			c.d.log.Debug("send cmd_ack", "err", err)
		}
	}
	fail := func(code string) { ack(wire.CmdAck{Error: &wire.AckError{Code: code}}) }
	if decodeErr != nil {
		fail(schemas.CodeBadRequest)
		return
	}
	var left time.Duration // until deadline_at_ms; 0: none given
	if cmd.DeadlineAtMs > 0 && c.clock.ms > 0 {
		if left = c.clock.left(time.Now(), cmd.DeadlineAtMs); left <= 0 {
			// Delivered after the tier gave up on it: at most once means
			// not now.
			fail(schemas.CodeDeadlineExceeded)
			return
		}
	}
	t := tools[cmd.Tool]
	if t == nil {
		fail(schemas.CodeToolNotFound)
		return
	}
	if !t.registered && (t.verb.Input == "" || c.d.o.Schemas.ValidateJSON(t.verb.Input, cmd.Arguments) != nil) {
		fail(schemas.CodeManifestInvalid)
		return
	}
	if c.debug {
		c.d.log.Debug("cmd", "tool", cmd.Tool, "request_id", cmd.RequestID)
	}
	if t.verb.Stream {
		if t.sh == nil {
			fail(schemas.CodeToolNotFound)
			return
		}
		c.stream(ctx, e.MsgID, cmd, t.sh, fail)
		return
	}
	h := t.h
	if h == nil {
		fail(schemas.CodeToolNotFound)
		return
	}
	deadline := time.Duration(cmd.DeadlineMs) * time.Millisecond
	if deadline <= 0 {
		deadline = wire.DefaultDeadlineMs * time.Millisecond
	}
	if left > 0 {
		deadline = min(deadline, left)
	}
	if traceparentRe.MatchString(cmd.Traceparent) {
		ctx = context.WithValue(ctx, traceparentKey{}, cmd.Traceparent)
	}
	hctx := ctx
	if !t.quick { // a quick handler returns at once: no deadline to keep
		var cancel context.CancelFunc
		hctx, cancel = context.WithTimeout(ctx, deadline)
		defer cancel()
	}
	res, err := h(hctx, cmd.Arguments)
	if err != nil {
		var be *schemas.Error
		switch {
		case errors.As(err, &be):
			fail(be.Code)
		case hctx.Err() != nil:
			fail(schemas.CodeDeadlineExceeded)
		default:
			fail(schemas.CodeInternal)
		}
		return
	}
	b, err := json.Marshal(res)
	if err != nil {
		fail(schemas.CodeInternal)
		return
	}
	if len(b) > c.maxFrame-ackSlack(e.MsgID) {
		if room := c.resultRoom(e.MsgID); len(b) > room {
			f, ok := res.(fitter)
			if ok {
				b = f.fit(room)
			}
			if b == nil || !ok {
				c.d.log.Warn("a result too large for the tier's frames", "tool", cmd.Tool, "bytes", len(b), "max_frame_bytes", c.maxFrame)
				fail(schemas.CodeInternal)
				return
			}
		}
	}
	ack(wire.CmdAck{OK: true, Result: b})
}

// ackSlack bounds what a cmd_ack's envelope and payload take besides
// its result, for a cmd_ack answering cmdID (each byte of which JSON may
// write in up to six): a result shorter than the frame limit by that much
// fits, and only a longer one needs resultRoom's exact figure, which
// costs an encode.
func ackSlack(cmdID string) int { return 128 + 6*len(cmdID) }

// resultRoom is how many bytes a result may take in the cmd_ack that
// answers the cmd cmdID, within the tier's frames.
func (c *conn) resultRoom(cmdID string) int {
	b, err := wire.Encode(wire.TypeCmdAck, cmdID, wire.CmdAck{OK: true, Result: json.RawMessage("0")})
	if err != nil {
		return 0
	}
	return c.maxFrame - (len(b) - 1)
}

// stream runs a stream handler until the tier cancels it (ctx ends): each
// frame goes out as a stream envelope in reply to the cmd. A handler that
// ends on its own, or fails, is reported with a cmd_ack.
func (c *conn) stream(ctx context.Context, cmdID string, cmd wire.Cmd, h StreamHandler, fail func(string)) {
	emit := func(frame any) error {
		data, err := json.Marshal(frame)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err // cancelled: send nothing more
		}
		// Not ctx itself: a write whose context ends makes the WebSocket
		// library drop the whole connection, and a cancel may land mid-write.
		return c.send(context.WithoutCancel(ctx), wire.TypeStream, cmdID, wire.StreamFrame{Event: "metric", Data: data})
	}
	err := h(ctx, cmd.Arguments, emit)
	switch {
	case ctx.Err() != nil:
		// cancelled: the tier has forgotten the stream, nothing to say
	case err != nil:
		fail(schemas.CodeInternal)
	default:
		if err := c.send(context.WithoutCancel(ctx), wire.TypeCmdAck, cmdID, wire.CmdAck{OK: true, Result: json.RawMessage("{}")}); err != nil {
			c.d.log.Debug("send cmd_ack", "err", err)
		}
	}
}

// traceparentKey keys a cmd's W3C trace context in its handler's context.
type traceparentKey struct{}

// traceparentRe is the form of a W3C traceparent a device passes on.
var traceparentRe = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// Traceparent returns the W3C trace context of the call a handler
// serves, when its tier sent one (wire.FeatureTrace): a handler's own
// work, traced, is its child. "" when none.
func Traceparent(ctx context.Context) string {
	tp, _ := ctx.Value(traceparentKey{}).(string)
	return tp
}
