package roles

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/oklog/run"
	"golang.org/x/net/netutil"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/certfile"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// shutdownTimeout bounds every graceful stop.
const shutdownTimeout = 5 * time.Second

func shutdownCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), shutdownTimeout)
}

// natsPart is the NATS a role uses: an embedded server, or an external one.
type natsPart struct {
	srv      *bus.Server // nil when external
	name     string      // of the embedded server
	store    string      // its JetStream store ("" when none is on disk)
	url      string
	replicas int // of the JetStream buckets okso creates
	// client is how a connection to an external NATS authenticates
	// (--nats-nkey, --nats-creds, --nats-ca); without a credential of
	// its own, a role takes its seed from the data dir, if there.
	client  bus.ClientOptions
	dataDir string
	// secured: the embedded server admits okso's roles alone (not
	// --nats-insecure).
	secured bool
	// credentialed: a connection to the external NATS was made with a
	// credential (a NATS that asks for one keeps okso's roles apart).
	credentialed bool
	log          *slog.Logger // nil: none
}

// bindOnly says that okso's buckets are the admin's to make and change,
// not a role's ([bus.InitState]): a role's credential may do neither.
func (p *natsPart) bindOnly() bool { return p.secured || p.credentialed }

// natsConfig selects the NATS of a role.
type natsConfig struct {
	URL      string   // external server(s); excludes the rest
	Listen   string   // expose the embedded server to clients
	Name     string   // embedded server name
	Cluster  string   // cluster name: with ClusterAddr, join a cluster
	Addr     string   // cluster listen address
	Routes   []string // the other members
	Replicas int      // bucket replicas; 0: 3 in a cluster of 3 or more, else 1
	// DataDir, when set, keeps the embedded server's JetStream store
	// (revocations) under DataDir/nats, and okso's NATS credentials in
	// DataDir/nats/creds; Role tells apart the stores of the roles that
	// share a data dir.
	DataDir string
	Role    string
	// Log, if set, gets the embedded server's fatal errors and the
	// warnings about its security.
	Log *slog.Logger
	// AuditRetention, when above zero, is how long the audit stream an
	// embedded server's okso makes keeps events (--audit-retention).
	AuditRetention time.Duration
	natsSecurity
}

// openNATS starts the embedded NATS server (and, when it admits okso's
// roles alone, makes okso's buckets, as the admin) or prepares to
// connect to an external one.
func openNATS(ctx context.Context, c natsConfig) (_ *natsPart, err error) {
	if err := c.natsSecurity.check(c); err != nil {
		return nil, err
	}
	replicas := c.Replicas
	if c.URL != "" {
		if c.Listen != "" || c.Addr != "" {
			return nil, errors.New("--nats-url excludes --nats-listen and --nats-cluster-addr")
		}
		client, err := c.clientOptions()
		if err != nil {
			return nil, err
		}
		return &natsPart{url: c.URL, replicas: max(replicas, 1), client: client, dataDir: c.DataDir, log: c.Log}, nil
	}
	if (c.Addr == "") != (c.Cluster == "") {
		return nil, errors.New("--nats-cluster and --nats-cluster-addr go together")
	}
	if c.Addr != "" && c.Listen == "" {
		return nil, errors.New("--nats-cluster-addr needs --nats-listen: the embedded server opens its routes only once it listens for clients")
	}
	if c.Addr != "" && len(c.Routes) == 0 {
		return nil, errors.New("--nats-cluster-addr needs --nats-routes: JetStream in a cluster needs the other members' routes")
	}
	if replicas <= 0 {
		replicas = 1
		if len(c.Routes) >= 2 { // this member and at least two others
			replicas = 3
		}
	}
	name, store := c.Name, ""
	if c.DataDir != "" {
		var err error
		if name, store, err = natsStore(c.DataDir, c.Role, c.Name); err != nil {
			return nil, err
		}
	}
	creds, serverTLS, err := c.serverSecurity()
	if err != nil {
		return nil, err
	}
	srv, err := bus.StartServer(bus.ServerOptions{Listen: c.Listen, Name: name, StoreDir: store, Log: c.Log,
		Cluster:     bus.ClusterOptions{Name: c.Cluster, Listen: c.Addr, Routes: c.Routes},
		Credentials: creds, TLS: serverTLS})
	if err != nil {
		return nil, err
	}
	c.warn(srv)
	p := &natsPart{srv: srv, name: name, store: store, replicas: replicas, dataDir: c.DataDir, secured: creds != nil, log: c.Log}
	if p.secured {
		defer func() {
			if err != nil {
				p.close()
			}
		}()
		if err := p.initState(ctx, c.AuditRetention); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// initState makes okso's buckets on the embedded server, as the admin:
// the roles' credentials may not ([bus.InitState]).
func (p *natsPart) initState(ctx context.Context, audit time.Duration) error {
	log := cmp.Or(p.log, slog.New(slog.DiscardHandler))
	nc, err := p.srv.ConnectAs(bus.RoleAdmin, "okso-init")
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := makeState(ctx, log, nc, p.replicas, audit); err != nil {
		return err
	}
	// What an older okso kept in NATS's global account, moved at start.
	if err := p.srv.Restore(ctx, nc); err != nil {
		return fmt.Errorf("move an older okso's revocations and node bindings into okso's buckets: %w", err)
	}
	return nil
}

// natsName is what an embedded server's name may be: it names its store
// directory too.
var natsName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// natsStore returns the name and the JetStream store directory of the
// embedded server of role in dataDir. The name is the one given
// (--nats-name) or else the one made on the role's first start and kept
// in dataDir/nats/<role>.name: JetStream's store belongs to a server
// name (a clustered server finds its state by it), so the name must not
// change across restarts. The store is dataDir/nats/<name>: roles that
// share a data dir (okso device and okso gateway on one machine) get
// names, and stores, of their own; two processes of one role on one data
// dir need --nats-name each, or the second is refused (the store is
// locked while its server runs).
func natsStore(dataDir, role, name string) (string, string, error) {
	dir := filepath.Join(dataDir, "nats")
	if name == "" {
		file := filepath.Join(dir, role+".name")
		b, err := os.ReadFile(file)
		switch {
		case err == nil:
			name = strings.TrimSpace(string(b))
			if !natsName.MatchString(name) {
				return "", "", fmt.Errorf("%s: %q is no NATS server name (delete the file to make a new one)", file, name)
			}
		case errors.Is(err, os.ErrNotExist):
			name = "okso-" + role + "-" + strings.ToLower(nuid.Next()[:8])
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return "", "", fmt.Errorf("create NATS store dir: %w", err)
			}
			if err := os.WriteFile(file, []byte(name+"\n"), 0o600); err != nil {
				return "", "", fmt.Errorf("keep the NATS server name: %w", err)
			}
		default:
			return "", "", fmt.Errorf("read the NATS server name: %w", err)
		}
	} else if !natsName.MatchString(name) {
		return "", "", fmt.Errorf("--nats-name %q: use up to 64 letters, digits, '.', '_' or '-' (it names the NATS store's directory too)", name)
	}
	return name, filepath.Join(dir, name), nil
}

// logAsyncErrors logs what NATS reports asynchronously, a slow consumer
// above all: messages it dropped (calls that will time out) would
// otherwise leave no trace.
func logAsyncErrors(log *slog.Logger, nc *nats.Conn) {
	nc.SetErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		subject := ""
		if sub != nil {
			subject = sub.Subject
		}
		log.Warn("nats asynchronous error", "subject", subject, "err", err)
	})
}

// clientURL is where other processes can reach this NATS ("" if nowhere).
func (p *natsPart) clientURL() string {
	if p.srv != nil {
		return p.srv.ClientURL()
	}
	return p.url
}

func (p *natsPart) close() {
	if p.srv != nil {
		p.srv.Shutdown()
	}
}

// startTimeout bounds the start of a role: its constructor fails, saying
// why, rather than wait longer (for a NATS cluster whose JetStream never
// forms, say), so that a role that cannot start exits within seconds.
// Three okso processes forming a NATS cluster at once take 2 to 8 s to
// have JetStream and okso's buckets (measured with -race on 2 cores).
const startTimeout = 12 * time.Second

// startContext is the context a role's constructor works within: it ends
// startTimeout from now, for errStartTimeout.
func startContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, startTimeout, errStartTimeout{})
}

// errStartTimeout is why a role's start context ended: the role could
// not start within startTimeout.
type errStartTimeout struct{}

func (errStartTimeout) Error() string { return fmt.Sprintf("not ready within %v", startTimeout) }

// openRegistry opens the registry.
func openRegistry(ctx context.Context, log *slog.Logger, nc *nats.Conn, o bus.RegistryOptions) (*bus.Registry, error) {
	if o.TTL != 0 && o.TTL < time.Second {
		return nil, fmt.Errorf("--lease-ttl %v: at least 1s (NATS message TTLs count whole seconds)", o.TTL)
	}
	return whileJetStreamForms(ctx, log, nc, func(ctx context.Context) (*bus.Registry, error) {
		return bus.OpenRegistry(ctx, nc, o)
	})
}

// whileJetStreamForms opens one of okso's buckets on nc with open,
// trying again until it succeeds or ctx ends (a role's start context):
// while a NATS cluster is still forming, JetStream has no leader and
// does not answer, or answers "temporarily unavailable". It first asks
// every second whether JetStream answers at all, then opens with 2 s per
// attempt: a start waits little longer than the cluster takes (when
// several processes create one replicated bucket at once, an answer can
// be lost while the bucket is made; the next attempt finds it). A NATS
// without JetStream (its API has no responders) is an error at once:
// waiting would not mend it.
func whileJetStreamForms[T any](ctx context.Context, log *slog.Logger, nc *nats.Conn, open func(context.Context) (T, error)) (T, error) {
	var zero T
	js, err := jetstream.New(nc)
	if err != nil {
		return zero, fmt.Errorf("open jetstream: %w", err)
	}
	if _, err := retryJetStream(ctx, log, time.Second, js.AccountInfo); err != nil {
		return zero, err
	}
	return retryJetStream(ctx, log, 2*time.Second, open)
}

// retryJetStream runs do, each attempt bounded by attempt, until it
// succeeds, fails for want of JetStream, or ctx ends.
func retryJetStream[T any](ctx context.Context, log *slog.Logger, attempt time.Duration, do func(context.Context) (T, error)) (T, error) {
	var last error // of an attempt ctx did not cut short, if any
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		v, err := do(actx)
		cancel()
		if err == nil {
			return v, nil
		}
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: no answer in %v", err, attempt)
		}
		if last == nil || ctx.Err() == nil {
			last = err
		}
		if errors.Is(err, bus.ErrNoBucket) || errors.Is(err, bus.ErrOldBucket) { // waiting would not mend it
			return v, err
		}
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			// Every server with JetStream answers its API, even while its
			// cluster forms ("temporarily unavailable").
			return v, fmt.Errorf("no JetStream on this NATS (okso keeps its registry in it: enable JetStream): %w", err)
		}
		log.Info("waiting for JetStream", "err", err)
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.As(cause, new(errStartTimeout)) {
				return v, fmt.Errorf("JetStream %v (a NATS cluster has it once a majority of its members are up "+
					"and routed to each other): %w", cause, last)
			}
			return v, last
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// httpPart is a bound listener and the server that will serve it. Bind
// it with listen, set its handler with handle, then serve it in a run
// group (actors, actor), or close it.
type httpPart struct {
	log  *slog.Logger
	ln   net.Listener
	srv  *http.Server
	pair *certfile.Pair // nil: plain
}

// listen binds addr, the value of flag, holding at most maxConns
// connections at once (0: no bound): beyond, a new connection waits in
// the kernel's backlog until one closes, so a flood of one listener can
// neither take every file descriptor of the process nor starve its other
// listeners.
func listen(flag, addr string, maxConns int) (*httpPart, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if maxConns > 0 {
		ln = netutil.LimitListener(ln, maxConns)
	}
	return &httpPart{ln: ln}, nil
}

// handle sets what p serves, and the log of its errors.
func (p *httpPart) handle(log *slog.Logger, h http.Handler) {
	p.log = log
	p.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute, ErrorLog: stdlog.New(httpErrors{log}, "", 0)}
}

// httpErrors writes what net/http logs (accept errors when the process
// runs out of file descriptors, a handler's panic) to log, as a warning
// "http server" whose err is net/http's line: one message, so a flood of
// them is counted, not written (repeatHandler), and no line bypasses the
// log's format.
type httpErrors struct{ log *slog.Logger }

func (w httpErrors) Write(p []byte) (int, error) {
	w.log.Warn("http server", "err", strings.TrimSpace(string(p)))
	return len(p), nil
}

func (p *httpPart) addr() string { return p.ln.Addr().String() }

// scheme is plain, or secure when p serves TLS.
func (p *httpPart) scheme(plain, secure string) string {
	if p.pair != nil {
		return secure
	}
	return plain
}

// close closes the listener of a part that will not serve; p may be nil.
func (p *httpPart) close() {
	if p != nil {
		_ = p.ln.Close() // nothing was served on it: no error to tell
	}
}

// actors adds the server to g, serving at once; p may be nil.
func (p *httpPart) actors(g *run.Group) {
	if p != nil {
		p.actor(g, nil, nil)
	}
}

// actor adds the server to g, serving once ready is closed (nil: at
// once); before is called on interrupt, before the HTTP server stops
// accepting.
func (p *httpPart) actor(g *run.Group, ready <-chan struct{}, before func(context.Context)) {
	stop := make(chan struct{})
	g.Add(func() error {
		if ready != nil {
			select {
			case <-ready:
			case <-stop:
				return nil
			}
		}
		if err := p.srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) {
		close(stop)
		ctx, cancel := shutdownCtx()
		defer cancel()
		if before != nil {
			before(ctx)
		}
		p.stop(ctx)
	})
}

// stop stops the server gracefully within ctx, then closes the
// connections still open; it closes the listener if Serve never started.
func (p *httpPart) stop(ctx context.Context) {
	if err := p.srv.Shutdown(ctx); err != nil {
		p.log.Warn("http server: connections still open at the stop, closed", "addr", p.addr(), "err", err)
		_ = p.srv.Close() // its error is the listener's, closed by Shutdown
	}
	_ = p.ln.Close() // if Serve never started; else closed already
}

// common holds what every server role loads.
type common struct {
	log     *slog.Logger
	schemas *schemas.Set
	signer  *auth.Signer      // nil for a role that only verifies
	public  ed25519.PublicKey // verifies tokens
	extra   []ed25519.PublicKey
	audit   auditLog
	dataDir string // of the signing key, and of the mock node ids' key
}

// auditLog says whether and how the auditors of a role log.
type auditLog struct {
	// NoAuditLog leaves audit events out of the log (--log-audit=false);
	// they are published on NATS all the same.
	NoAuditLog bool
	// LogRepeats is the period in which audit lines of a kind are logged
	// once and counted (--log-repeats; 0: each is logged).
	LogRepeats time.Duration
}

// auditor returns an Auditor that publishes on nc and logs unless
// NoAuditLog, bounding its lines by LogRepeats; tick, if set, ends each
// period of it. It logs what it cannot publish either way.
func (c *common) auditor(nc *nats.Conn, tick <-chan time.Time) *bus.Auditor {
	a := &bus.Auditor{NC: nc, ErrorLog: c.log}
	if !c.audit.NoAuditLog {
		a.Log, a.LogRepeats, a.LogTick = c.log, c.audit.LogRepeats, tick
	}
	return a
}

// verifier accepts tokens of the current key and of the keys kept after a
// rotation (data dir keys/*.pub).
func (c *common) verifier(audience string) *auth.Verifier {
	return auth.NewKeySetVerifier(c.public, c.extra, audience)
}

// loadCommon loads the schemas and the signing key of dataDir, creating
// the key on first start.
func loadCommon(log *slog.Logger, dataDir string) (*common, error) {
	set, err := schemas.Load()
	if err != nil {
		return nil, err
	}
	signer, err := auth.LoadOrCreateSigner(dataDir)
	if err != nil {
		return nil, err
	}
	extra, err := auth.LoadExtraKeys(dataDir)
	if err != nil {
		return nil, err
	}
	return &common{log: log, schemas: set, signer: signer, public: signer.Public(), extra: extra, dataDir: dataDir}, nil
}

// loadVerifier is loadCommon for a role that only verifies tokens: with no
// signing.key in dataDir, signing.pub is enough (keep the private key out
// of a cluster). With neither, a key is created, with a warning.
func loadVerifier(log *slog.Logger, dataDir string) (*common, error) {
	if _, err := os.Stat(filepath.Join(dataDir, auth.KeyFile)); err == nil {
		return loadCommon(log, dataDir)
	}
	pub, err := auth.LoadPublicKey(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		log.Warn("no signing key in the data dir: creating one; processes with another data dir will refuse its tokens",
			"data_dir", dataDir)
		return loadCommon(log, dataDir)
	}
	if err != nil {
		return nil, err
	}
	set, err := schemas.Load()
	if err != nil {
		return nil, err
	}
	extra, err := auth.LoadExtraKeys(dataDir)
	if err != nil {
		return nil, err
	}
	return &common{log: log, schemas: set, public: pub, extra: extra, dataDir: dataDir}, nil
}

// openRevocations opens the shared revocation set.
func openRevocations(ctx context.Context, log *slog.Logger, nc *nats.Conn, np *natsPart) (*bus.Revocations, error) {
	return whileJetStreamForms(ctx, log, nc, func(ctx context.Context) (*bus.Revocations, error) {
		// A role's NATS credential may only read the revocations: okso
		// token revoke, the admin's, writes them.
		return bus.OpenRevocations(ctx, nc, bus.RevocationOptions{Replicas: np.replicas, Log: log, ReadOnly: np.bindOnly()})
	})
}

// gatewayPart is the agents' door.
type gatewayPart struct {
	nc      *nats.Conn
	audit   *bus.Auditor
	gw      *mcp.Gateway
	http    *httpPart
	revoked *bus.Revocations
	issuers *auth.Issuers    // nil: none
	oauth   *mcp.OAuthServer // nil without --oauth-server
	summary *callSummary
	tick    <-chan time.Time // of the summary; nil: every summaryPeriod
	drain   time.Duration    // unready but serving, before the stop
}

type gatewayConfig struct {
	AuditRetention      time.Duration // keep audit events in JetStream this long (0: do not keep)
	Addr                string
	Budget              time.Duration
	Stateful            bool
	NoFastPath          bool
	ToolNames           string // the form of listed tool names: safe or seed
	AllowedOrigins      []string
	Audience            string
	Version             string
	MaxStreamsPerTenant int
	StreamPing          time.Duration
	StreamIdle          time.Duration
	PublicURL           string
	MaxConnections      int // held by the MCP listener at once (0: no bound)
	TLS                 tlsFiles
	// OAuthIssuers is the --oauth-issuers file: the external issuers
	// whose tokens the gateway accepts beside okso's ("": none).
	OAuthIssuers string
	// CallerTimeout bounds a relayed call to a caller's tool (0: 60 s);
	// CallerLeaseTTL is the lease of a declaration, and of its claim of
	// the caller id, in okso_callers (0: 15 s): how long they outlive a
	// replica that died holding its listen.
	CallerTimeout  time.Duration
	CallerLeaseTTL time.Duration
	// ShutdownDrain is how long a stopping gateway stays unready but
	// serving, before it stops accepting (0: it stops at once).
	ShutdownDrain time.Duration
	// SummaryTick, if set, says when to write the calls line (default:
	// every minute).
	SummaryTick <-chan time.Time
	// AuditTick, if set, ends each period of the audit log's repeats
	// (default: every --log-repeats).
	AuditTick <-chan time.Time
	// OAuth is okso's own authorization server (--oauth-server).
	OAuth oauthConfig
}

// newGatewayPart binds the MCP listener, then connects to np, opens the
// registry and the revocations and builds the gateway.
func newGatewayPart(ctx context.Context, c *common, np *natsPart, cfg gatewayConfig) (_ *gatewayPart, err error) {
	if cfg.CallerLeaseTTL != 0 && cfg.CallerLeaseTTL < time.Second {
		return nil, fmt.Errorf("--caller-lease-ttl %v: at least 1s (NATS message TTLs count whole seconds)", cfg.CallerLeaseTTL)
	}
	if cfg.CallerTimeout < 0 {
		return nil, fmt.Errorf("--caller-timeout %v: must be positive", cfg.CallerTimeout)
	}
	pair, err := cfg.TLS.load(c.log, "--tls")
	if err != nil {
		return nil, err
	}
	hp, err := listen("--mcp-addr", cfg.Addr, cfg.MaxConnections)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			hp.close()
		}
	}()
	if pair != nil {
		hp.serveTLS(pair, nil, "h2", "http/1.1")
	}
	hp.warnPlain(c.log.With("role", "gateway"), "agent tokens and tool calls")
	nc, err := np.connect(bus.RoleGateway, "okso-gateway")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	logAsyncErrors(c.log, nc)
	reg, err := openRegistry(ctx, c.log, nc, bus.RegistryOptions{Replicas: np.replicas, BindOnly: np.bindOnly()})
	if err != nil {
		return nil, err
	}
	remotes, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Remotes, error) {
		return bus.OpenRemotes(ctx, nc, bus.RemotesOptions{Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	callers, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Callers, error) {
		return bus.OpenCallers(ctx, nc, bus.CallersOptions{TTL: cfg.CallerLeaseTTL, Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	revoked, err := openRevocations(ctx, c.log, nc, np)
	if err != nil {
		return nil, err
	}
	if cfg.AuditRetention > 0 {
		if err := bus.KeepAudit(ctx, nc, cfg.AuditRetention, np.replicas, false, np.bindOnly()); errors.Is(err, bus.ErrOtherRetention) {
			c.log.Warn("--audit-retention", "err", err)
		} else if err != nil {
			return nil, err
		}
	}
	aud := cfg.Audience
	if aud == "" {
		aud = auth.AudienceGateway
	}
	var verifier mcp.TokenVerifier = c.verifier(aud)
	var issuers *auth.Issuers
	if cfg.OAuthIssuers != "" {
		var cfgs []auth.IssuerConfig
		if cfgs, err = loadIssuers(cfg.OAuthIssuers); err != nil {
			return nil, err
		}
		// Fail fast: an issuer that cannot be reached now is a wrong URL
		// more often than an outage, and a gateway that started without
		// it would refuse all its users with a reason only in 401s.
		if issuers, err = auth.NewIssuers(ctx, cfgs, auth.IssuersOptions{Logger: c.log.With("role", "gateway")}); err != nil {
			return nil, fmt.Errorf("--oauth-issuers %s: %w", cfg.OAuthIssuers, err)
		}
		defer func() {
			if err != nil {
				issuers.Close()
			}
		}()
		verifier = auth.NewTrust(c.verifier(aud), issuers)
		c.log.Info("trusting OAuth issuers", "role", "gateway", "issuers", issuers.URLs())
	}
	summary := &callSummary{log: c.log.With("role", "gateway"), period: summaryPeriod}
	audit := c.auditor(nc, cfg.AuditTick)
	audit.Observe = summary.observe
	var oauth *mcp.OAuthServer
	if cfg.OAuth.Server {
		if oauth, err = newOAuthServer(ctx, c, nc, np, cfg.OAuth, audit); err != nil {
			return nil, err
		}
	}
	gw, err := mcp.New(mcp.Options{
		NC:             nc,
		Registry:       reg,
		Remotes:        remotes,
		Callers:        callers,
		CallerTimeout:  cfg.CallerTimeout,
		Relayers:       []bus.Role{bus.RoleGateway},
		Schemas:        c.schemas,
		Verifier:       verifier,
		Auditor:        audit,
		Logger:         c.log.With("role", "gateway"),
		Budget:         cfg.Budget,
		Stateful:       cfg.Stateful,
		NoFastPath:     cfg.NoFastPath,
		ToolNames:      cfg.ToolNames,
		AllowedOrigins: cfg.AllowedOrigins,
		Version:        cmp.Or(cfg.Version, Version),
		PublicURL:      cfg.PublicURL,
		Revoked:        revoked,
		OAuth:          oauth,

		AuthorizationServers: issuers.URLs(),
		MaxStreamsPerTenant:  cfg.MaxStreamsPerTenant,
		PingInterval:         cfg.StreamPing,
		IdleTimeout:          cfg.StreamIdle,
	})
	if err != nil {
		return nil, err
	}
	hp.handle(c.log.With("role", "gateway"), gw.Handler())
	audit.Start()
	return &gatewayPart{nc: nc, audit: audit, gw: gw, http: hp, revoked: revoked, issuers: issuers, oauth: oauth, drain: cfg.ShutdownDrain,
		summary: summary, tick: cfg.SummaryTick}, nil
}

func (p *gatewayPart) url() string {
	return p.http.scheme("http://", "https://") + p.http.addr() + "/mcp"
}

func (p *gatewayPart) actors(g *run.Group) {
	contextActor(g, p.gw.Run)
	if p.oauth != nil {
		contextActor(g, p.oauth.Run)
	}
	contextActor(g, func(ctx context.Context) error {
		tick := p.tick
		if tick == nil {
			t := time.NewTicker(summaryPeriod)
			defer t.Stop()
			tick = t.C
		}
		p.summary.run(ctx, tick)
		return nil
	})
	revoked := followRevocations(g, p.revoked, nil)
	// Serve once the registry is loaded, so the first tools/list is whole,
	// and the revocations, so no revoked token gets in after a restart;
	// on stop, streams get their 1000 close before the server drains.
	ready := p.gw.Ready()
	ctx, cancel := context.WithCancel(context.Background())
	g.Add(func() error {
		for _, c := range []<-chan struct{}{ready, revoked} {
			select {
			case <-c:
			case <-ctx.Done():
				return nil
			}
		}
		if err := p.http.srv.Serve(p.http.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) {
		cancel()
		if p.drain > 0 {
			// Unready, but serving: load balancers take the gateway out of
			// rotation before it stops accepting (see mcp.Gateway.Drain).
			p.gw.Drain()
			time.Sleep(p.drain)
		}
		p.gw.CloseStreams()
		p.gw.EndListens()
		sctx, scancel := shutdownCtx()
		defer scancel()
		p.http.stop(sctx)
	})
}

func (p *gatewayPart) close() {
	p.audit.Close()
	p.nc.Close()
	p.issuers.Close()
}

// tierPart is the devices' door.
type tierPart struct {
	nc      *nats.Conn
	audit   *bus.Auditor
	tier    *tier.Tier
	http    *httpPart
	revoked *bus.Revocations
}

type tierConfig struct {
	Addr string
	TLS  tlsFiles
	// ClientCA, if set, turns on device mTLS (--client-ca): a PEM bundle
	// of the CAs that sign devices' client certificates.
	ClientCA          string
	MaxFrameBytes     int
	AuthTimeout       time.Duration
	PingInterval      time.Duration
	LeaseTTL          time.Duration
	ConnRatePerIP     float64
	ConnBurstPerIP    int
	MaxSessions       int
	MaxPendingPerNode int
	MaxConnections    int // held by the device listener at once (0: MaxSessions + deviceConnSlack)
	NodeBindingTTL    time.Duration
	MaxToolsPerTenant int
	MaxClockSkew      time.Duration
	// NodeLabels is the --node-labels file: the operator's names and
	// labels of nodes ([loadNodeLabels]).
	NodeLabels string
	// AuditTick, if set, ends each period of the audit log's repeats
	// (default: every --log-repeats).
	AuditTick <-chan time.Time
}

// deviceConnSlack is how many connections beyond --max-sessions the
// device listener holds by default: those the tier is refusing (4429),
// authenticating, or replacing.
const deviceConnSlack = 1024

// newTierPart binds the device listener, then connects to np, opens the
// registry, the revocations and the node bindings and builds the tier.
func newTierPart(ctx context.Context, c *common, np *natsPart, cfg tierConfig) (_ *tierPart, err error) {
	nodes, err := loadNodeLabels(cfg.NodeLabels)
	if err != nil {
		return nil, err
	}
	maxConns := cfg.MaxConnections
	if maxConns == 0 && cfg.MaxSessions > 0 {
		maxConns = cfg.MaxSessions + deviceConnSlack
	}
	pair, err := cfg.TLS.load(c.log, "--tls")
	if err != nil {
		return nil, err
	}
	var clientCAs *certfile.Bundle
	if cfg.ClientCA != "" {
		if pair == nil {
			return nil, errors.New("--client-ca needs --tls-cert and --tls-key: device mTLS is TLS first")
		}
		if clientCAs, err = certfile.LoadBundle(cfg.ClientCA, c.log); err != nil {
			return nil, fmt.Errorf("--client-ca: %w", err)
		}
	}
	hp, err := listen("--device-addr", cfg.Addr, maxConns)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			hp.close()
		}
	}()
	if pair != nil {
		// HTTP/1.1 alone: the WebSocket upgrade needs it.
		hp.serveTLS(pair, clientCAs, "http/1.1")
	}
	hp.warnPlain(c.log.With("role", "device"), "device tokens, tool calls and their results")
	nc, err := np.connect(bus.RoleDevice, "okso-device-tier")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			nc.Close()
		}
	}()
	logAsyncErrors(c.log, nc)
	logNATSLink(c.log.With("role", "device"), nc)
	reg, err := openRegistry(ctx, c.log, nc, bus.RegistryOptions{TTL: cfg.LeaseTTL, Replicas: np.replicas, BindOnly: np.bindOnly()})
	if err != nil {
		return nil, err
	}
	revoked, err := openRevocations(ctx, c.log, nc, np)
	if err != nil {
		return nil, err
	}
	if cfg.NodeBindingTTL != 0 && cfg.NodeBindingTTL < time.Second {
		return nil, fmt.Errorf("--node-binding-ttl %v: at least 1s (NATS message TTLs count whole seconds)", cfg.NodeBindingTTL)
	}
	bindings, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.Bindings, error) {
		return bus.OpenBindings(ctx, nc, bus.BindingsOptions{TTL: cfg.NodeBindingTTL, Replicas: np.replicas, Registry: reg,
			BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	audit := c.auditor(nc, cfg.AuditTick)
	tier, err := tier.New(tier.Options{
		Requesters:  []bus.Role{bus.RoleGateway},
		Revoked:     revoked,
		Bindings:    bindings,
		ClientCerts: clientCAs != nil,

		MaxToolsPerTenant: cfg.MaxToolsPerTenant,
		MaxClockSkew:      cfg.MaxClockSkew,
		Nodes:             nodes,

		ConnRatePerIP:     cfg.ConnRatePerIP,
		ConnBurstPerIP:    cfg.ConnBurstPerIP,
		MaxSessions:       cfg.MaxSessions,
		MaxPendingPerNode: cfg.MaxPendingPerNode,
		NC:                nc,
		Registry:          reg,
		Schemas:           c.schemas,
		Verifier:          c.verifier(auth.AudienceDevice),
		Auditor:           audit,
		Logger:            c.log.With("role", "device"),
		MaxFrameBytes:     cfg.MaxFrameBytes,
		AuthTimeout:       cfg.AuthTimeout,
		PingInterval:      cfg.PingInterval,
	})
	if err != nil {
		return nil, err
	}
	hp.handle(c.log.With("role", "device"), tier.Handler())
	audit.Start()
	return &tierPart{nc: nc, audit: audit, tier: tier, http: hp, revoked: revoked}, nil
}

func (p *tierPart) url() string { return p.http.scheme("ws://", "wss://") + p.http.addr() + wire.Path }

// ownTLS is the TLS config of this process's own devices dialling p:
// they trust its certificate alone (nil when p is plain).
func (p *tierPart) ownTLS() *tls.Config {
	if p.http.pair == nil {
		return nil
	}
	return p.http.pair.PinnedClient()
}

func (p *tierPart) actors(g *run.Group) {
	// A revoked device token loses its live sessions too.
	revoked := followRevocations(g, p.revoked, p.tier.Revoke)
	// Devices first get 1001 so they reconnect elsewhere; then the listener
	// stops. Devices are served once the revocations are loaded: the
	// listener holds them until then.
	p.http.actor(g, revoked, func(ctx context.Context) {
		if err := p.tier.Shutdown(ctx); err != nil {
			p.http.log.Warn("device tier: sessions still open at the stop", "err", err)
		}
	})
}

// followRevocations adds an actor that follows the revocation bucket,
// calling onRevoke (if set) for each revoked token id, and returns a
// channel closed once the revocations present are loaded.
func followRevocations(g *run.Group, r *bus.Revocations, onRevoke func(jti string)) <-chan struct{} {
	loaded := make(chan struct{})
	var once sync.Once
	contextActor(g, func(ctx context.Context) error {
		return r.Run(ctx, func() { once.Do(func() { close(loaded) }) }, onRevoke)
	})
	return loaded
}

func (p *tierPart) close() {
	p.audit.Close()
	p.nc.Close()
}

// fleetPart is a set of simulated devices.
type fleetPart struct {
	log       *slog.Logger
	devices   []*agent.Device
	watch     *linkWatch    // says when the tier goes away and comes back
	links     []*deviceLink // each device's, in watch
	connected atomic.Int64  // devices that got their first announce_ok
	refused   atomic.Int64  // devices a tier refused for good
	// rate is how many devices start dialling per second (0: all at once).
	rate int
}

// newFleetPart makes n simulated devices of tenant dialling urls, with
// tlsConf for wss:// ones (nil: the system's roots). The first devices
// are the nodes ids, if given; the others get node ids derived from the
// data dir's mock key, kind, tenant and seed ([mockNodeIDs]), the same at
// each start.
func newFleetPart(c *common, kind fleetKind, n int, tenant string, urls []string, tlsConf *tls.Config, seed uint64, ids ...string) (*fleetPart, error) {
	if !schemas.ValidTenant(tenant) {
		return nil, fmt.Errorf("tenant %q: use 1-64 letters, digits, _ or -", tenant)
	}
	f := &fleetPart{log: c.log.With("role", "mock-fleet")}
	f.watch = newLinkWatch(f.log, fleetLinkWindow)
	if n > 0 && c.signer == nil {
		return nil, errors.New("simulated devices need the signing key (signing.key) in the data dir")
	}
	derived, err := mockNodeIDs(c.dataDir, kind, tenant, seed, len(ids), n)
	if err != nil {
		return nil, err
	}
	ids = append(ids[:len(ids):len(ids)], derived...)
	for i, id := range ids[:n] {
		tok, err := c.signer.Mint(auth.MintOptions{
			Subject: id, Tenant: tenant, Scopes: []string{auth.ScopeDeviceConnect},
			Audience: auth.AudienceDevice, TTL: 365 * 24 * time.Hour,
		})
		if err != nil {
			return nil, err
		}
		o := agent.MockOptions(id, c.schemas, seed)
		o.URLs, o.TLS, o.Token, o.Logger = urls, tlsConf, tok, f.log
		o.Name, o.Labels = mockName(i), mockLabels(i)
		var once sync.Once
		link := f.watch.add()
		o.OnReady = func([]string) {
			once.Do(func() { f.connected.Add(1) })
			link.ready()
		}
		o.OnLost, o.OnFail = link.lost, link.failed
		d, err := agent.New(o)
		if err != nil {
			return nil, err
		}
		f.devices = append(f.devices, d)
		f.links = append(f.links, link)
	}
	return f, nil
}

// mockName is the name of the i-th simulated device of a fleet. Fleets
// share names (each has a mock-0): a name is for people and filters, the
// node id is the identity.
func mockName(i int) string { return "mock-" + strconv.Itoa(i) }

// mockLabels are the labels of the i-th simulated device of a fleet:
// fleet=mock on all, and a zone of three taken in turn (a, b, c), so
// that a fleet filter has something to choose among.
func mockLabels(i int) map[string]string {
	return map[string]string{"fleet": "mock", "zone": string(rune('a' + i%3))}
}

func (f *fleetPart) actors(g *run.Group) {
	if len(f.devices) == 0 {
		return
	}
	contextActor(g, func(ctx context.Context) error {
		var wg sync.WaitGroup
		wg.Go(func() { f.progress(ctx) })
		var pace <-chan time.Time
		if f.rate > 0 && len(f.devices) > f.rate {
			t := time.NewTicker(time.Second / time.Duration(f.rate))
			defer t.Stop()
			pace = t.C
		}
	start:
		for i, d := range f.devices {
			if pace != nil {
				select {
				case <-ctx.Done():
					break start
				case <-pace:
				}
			}
			wg.Go(func() {
				if err := d.Run(ctx); err != nil {
					// A fleet's devices are refused alike (a token of
					// another key): the first says why, the progress line
					// counts them all.
					if f.refused.Add(1) == 1 {
						f.log.Error("mock device stopped", "node_id", d.NodeID(), "err", err)
					} else {
						f.log.Debug("mock device stopped", "node_id", d.NodeID(), "err", err)
					}
					f.links[i].refused()
				}
			})
		}
		<-ctx.Done() // a device that gave up does not stop the role
		wg.Wait()
		f.watch.stop()
		return nil
	})
}

// progress logs how many devices are connected, every second until all
// are, then once more with the time it took.
func (f *fleetPart) progress(ctx context.Context) {
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	n := int64(len(f.devices))
	for {
		if c := f.connected.Load(); c == n {
			f.log.Info("mock devices connected", "count", n, "elapsed", time.Since(start).Round(time.Millisecond).String())
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c := f.connected.Load(); c < n { // else the line above, at once
				args := []any{"connected", c, "of", n}
				if r := f.refused.Load(); r > 0 {
					args = append(args, "refused", r)
				}
				if failing, why := f.watch.failing(); failing > 0 {
					args = append(args, "failing", failing, "err", why)
				}
				f.log.Info("mock devices connecting", args...)
			}
		}
	}
}

// agentPart is the real device agent of this host.
type agentPart struct {
	log   *slog.Logger
	d     *agent.Device
	link  *deviceLink
	watch *linkWatch
	// claim is the data dir's hold on the node; nil when the node is its
	// --token's.
	claim *nodeClaim
	// endsRole: a replaced agent ends its role (okso agent, which has
	// nothing else to serve), rather than wait for it to end.
	endsRole bool

	stopDevice context.CancelFunc // set before d runs
	replaced   atomic.Bool        // its node was taken from it
	gaveUp     sync.Once
}

// newAgentPart builds the agent. With a token, the node id is the token's
// subject; without, it mints a device token with the data dir's key for a
// node id kept in the data dir, so this host keeps its node id, and holds
// that node in the data dir (a nodeClaim; replace takes it over).
// tlsConf is for wss:// URLs (nil: the system's roots). nodeID, if set,
// is the node id of the minted token (that of a client certificate).
//
// name and labels are the agent's own (--name, --label); name "" is the
// host's ([agent.HostName]). replace takes the data dir's node over from
// another process serving it (--replace).
func newAgentPart(c *common, urls []string, tlsConf *tls.Config, token, dataDir, tenant, nodeID, name string,
	labels map[string]string, replace bool) (_ *agentPart, err error) {
	var claim *nodeClaim
	var id string
	if token != "" {
		var err error
		if id, err = auth.UnverifiedSubject(token); err != nil {
			return nil, fmt.Errorf("--token: %w", err)
		}
		if !schemas.ValidNodeID(id) {
			return nil, fmt.Errorf("--token: its subject %q is not a node id", id)
		}
	} else {
		var err error
		if id = nodeID; id == "" {
			if id, err = hostNodeID(dataDir); err != nil {
				return nil, err
			}
		}
		if token, err = c.signer.Mint(auth.MintOptions{Subject: id, Tenant: tenant,
			Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice, TTL: 365 * 24 * time.Hour}); err != nil {
			return nil, err
		}
		if claim, err = claimNode(c.log, dataDir, id, replace); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				claim.release()
			}
		}()
	}
	log := c.log.With("role", "agent", "node_id", id)
	watch := newLinkWatch(log, 0) // one device: say it at once
	a := &agentPart{log: log, link: watch.add(), watch: watch, claim: claim}
	o := agent.HostOptions(id, c.schemas, Version)
	o.URLs, o.TLS, o.Token, o.Logger = urls, tlsConf, token, log
	if name != "" {
		o.Name = name
	}
	o.Labels = labels
	connected := false // OnReady is called in turn, from Run's goroutine
	o.OnReady = func(tools []string) {
		if connected {
			a.link.ready() // "device tier back", if it was lost
			return
		}
		connected = true
		// One line, also when it ends the outage of a tier that was not
		// up yet: "agent connected", not that and "device tier back".
		a.link.readyAs("agent connected", "tools", len(tools))
	}
	o.OnLost = func(err error) {
		if !a.giveUp(err) {
			a.link.lost(err)
		}
	}
	o.OnFail = func(err error) {
		if !a.giveUp(err) {
			a.link.failed(err)
		}
	}
	if a.d, err = agent.New(o); err != nil {
		return nil, err
	}
	return a, nil
}

// giveUp stops the agent when its node was taken from it: the tier
// closed its session for a newer one of the node (4409), or another
// process marked the data dir's node as its own (--replace). It is
// called from d.Run's hooks, after a connection ended for err, so that
// the device tries no more.
func (a *agentPart) giveUp(err error) bool {
	var ce websocket.CloseError
	if c, ok := a.claim.takenOver(); ok {
		a.takenOver(fmt.Sprintf("process %d took it over (--replace)", c.PID))
	} else if errors.As(err, &ce) && ce.Code == wire.CloseReplaced {
		a.takenOver("the device tier closed its session for a newer session of the node (4409)")
	} else {
		return false
	}
	return true
}

// watchClaim stops the agent when another process marks the data dir's
// node as its own while the agent is connected: the two may be on tiers
// of different NATS, where no 4409 tells. It looks once a second until
// ctx ends.
func (a *agentPart) watchClaim(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c, ok := a.claim.takenOver(); ok {
				a.takenOver(fmt.Sprintf("process %d took it over (--replace)", c.PID))
				return
			}
		}
	}
}

// takenOver stops the agent serving its node, saying why once: coming
// back would take the node back in turn, every backoff.
func (a *agentPart) takenOver(why string) {
	a.gaveUp.Do(func() {
		args := []any{"reason", why}
		if a.claim != nil {
			args = append(args, "data_dir", a.claim.dir)
		}
		a.log.Warn("node taken over: this agent stops serving it", args...)
		a.replaced.Store(true)
		a.stopDevice()
	})
}

// hostNodeID reads this host's node id from the data dir, creating it once.
func hostNodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "agent-node-id")
	if b, err := os.ReadFile(path); err == nil {
		id := strings.TrimSpace(string(b))
		if !schemas.ValidNodeID(id) {
			return "", fmt.Errorf("%s: not a node id", path)
		}
		return id, nil
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("create data dir: %w", err)
	}
	id := wire.NewNodeID()
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write agent node id: %w", err)
	}
	return id, nil
}

func (a *agentPart) actors(g *run.Group) {
	if a == nil {
		return
	}
	contextActor(g, func(ctx context.Context) error {
		defer a.claim.release()
		dctx, stop := context.WithCancel(ctx)
		defer stop()
		a.stopDevice = stop
		var claiming sync.WaitGroup
		if a.claim != nil {
			if !a.claim.held() {
				claiming.Go(func() { a.claim.hold(dctx) })
			}
			claiming.Go(func() { a.watchClaim(dctx) })
		}
		err := a.d.Run(dctx)
		stop()
		claiming.Wait()
		switch {
		case err != nil:
			a.log.Error("agent stopped", "err", err)
			a.link.refused()
		case a.replaced.Load():
			a.link.refused()
			a.claim.release() // now: the process taking over waits for it
			if a.endsRole {
				a.watch.stop()
				return nil
			}
		}
		<-ctx.Done() // an agent that was refused does not stop its role
		a.watch.stop()
		return nil
	})
}

// close lets go of what newAgentPart took, for an agent that never runs.
func (a *agentPart) close() {
	if a != nil {
		a.claim.release()
	}
}
