package bus

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/nats-io/nuid"

	"github.com/okso-io/okso/internal/rawio"
)

// ServerOptions configures an embedded NATS server. The zero value runs a
// JetStream-enabled server that accepts only in-process connections and
// keeps JetStream data in memory.
type ServerOptions struct {
	// Listen, when set (host:port, port 0 for any), also exposes the server
	// to other processes over TCP.
	Listen string
	// StoreDir, when set, is where JetStream keeps file-backed data
	// (in StoreDir/jetstream). It belongs to one server at a time: the
	// server holds a lock on it while it runs, and a second one is
	// refused. Give it the same Name across restarts: a clustered
	// server's store is that of its name.
	StoreDir string
	// Name is the server's name, unique in a cluster (default: random).
	Name string
	// Cluster, when its Listen is set, joins the embedded servers of
	// several okso processes into one NATS cluster (JetStream clustered);
	// it needs Listen and the other members' Routes.
	Cluster ClusterOptions
	// Log, if set, gets the server's fatal errors once it has started, at
	// error level (one while it starts is StartServer's error). The
	// server's other log lines are dropped.
	Log *slog.Logger
	// Credentials, when set, are the only way in: every client, an
	// in-process one too, authenticates as one of okso's roles and may do
	// only what that role may ([Role.Permissions]), with okso's buckets
	// in an account no client is in ([AccountsConfig]); cluster routes
	// authenticate with their route secret. The buckets are then made by
	// the admin ([InitState]). Nil: anyone who reaches the server may do
	// anything (tests; okso's --nats-insecure).
	Credentials *Credentials
	// TLS, when set, is served on the client and route listeners, and
	// its RootCAs (the system's when nil) verify the other members when
	// this server dials their routes. In-process connections do without.
	TLS *tls.Config
}

// ClusterOptions configure an embedded server's cluster membership.
type ClusterOptions struct {
	Name   string   // cluster name, the same on every member ("okso")
	Listen string   // host:port for routes from the other members
	Routes []string // nats-route://host:port of the other members (or all)
}

// Server is a running embedded nats-server.
type Server struct {
	ns    *server.Server
	creds *Credentials // nil: anyone may connect
	store string       // StoreDir, if set
	tmp   string       // removed on Shutdown
	lock  *os.File     // of StoreDir, released on Shutdown
}

// StartServer starts an embedded nats-server and waits until it accepts
// connections, for up to 10 s; it fails at once, saying why, when the
// server cannot start (a listener whose address is taken, say). NoSigs
// is always on, so signals stay with okso.
func StartServer(opts ServerOptions) (*Server, error) {
	name := opts.Name
	if name == "" {
		name = "okso-" + nuid.Next()[:10]
	}
	o := &server.Options{}
	if opts.Credentials != nil {
		// The accounts and users of okso nats server-config, exactly.
		conf, err := opts.Credentials.ServerConfig()
		if err != nil {
			return nil, err
		}
		if err := o.ProcessConfigString(conf); err != nil {
			return nil, fmt.Errorf("nats accounts: %w", err)
		}
	}
	o.ServerName, o.JetStream, o.NoSigs, o.NoLog = name, true, true, true
	o.DontListen, o.StoreDir = opts.Listen == "", opts.StoreDir
	if opts.TLS != nil {
		o.TLSConfig = opts.TLS
		o.TLSTimeout = tlsTimeout
	}
	if opts.Listen != "" {
		host, port, err := splitHostPort(opts.Listen)
		if err != nil {
			return nil, fmt.Errorf("nats listen address: %w", err)
		}
		o.Host, o.Port = host, port
	}
	if opts.Cluster.Listen != "" {
		// nats-server opens its routes once its client listener is up: a
		// clustered server that does not listen would never be ready, and
		// its Shutdown would then wait for ever. JetStream in a cluster
		// wants the other members' routes from the start.
		if opts.Listen == "" {
			return nil, errors.New("nats cluster: a clustered server must also listen for clients")
		}
		if len(opts.Cluster.Routes) == 0 {
			return nil, errors.New("nats cluster: JetStream needs the routes of the other members")
		}
		host, port, err := splitHostPort(opts.Cluster.Listen)
		if err != nil {
			return nil, fmt.Errorf("nats cluster listen address: %w", err)
		}
		o.Cluster = server.ClusterOpts{Name: opts.Cluster.Name, Host: host, Port: port}
		if o.Cluster.Name == "" {
			o.Cluster.Name = "okso"
		}
		o.Routes = server.RoutesFromStr(strings.Join(opts.Cluster.Routes, ","))
		if len(o.Routes) == 0 {
			return nil, fmt.Errorf("nats cluster: no route in %q", opts.Cluster.Routes)
		}
		if c := opts.Credentials; c != nil {
			// Routes this server dials carry the secret in their URL;
			// the ones it learns from the others, its own user.
			o.Cluster.Username, o.Cluster.Password = routeUser, c.routeSecret
			for _, u := range o.Routes {
				u.User = url.UserPassword(routeUser, c.routeSecret)
			}
		}
		if opts.TLS != nil {
			o.Cluster.TLSConfig = opts.TLS
			o.Cluster.TLSTimeout = tlsTimeout
		}
	}
	s := &Server{}
	if o.StoreDir != "" {
		if err := os.MkdirAll(o.StoreDir, 0o700); err != nil {
			return nil, fmt.Errorf("jetstream store dir: %w", err)
		}
		var err error
		if s.lock, err = lockStore(o.StoreDir); err != nil {
			return nil, err
		}
		s.store = o.StoreDir
		if err := s.checkAccounts(opts); err != nil {
			s.release()
			return nil, err
		}
	} else {
		// JetStream needs a directory even when every stream okso creates is
		// in memory; give each server its own so processes never share one.
		var err error
		if s.tmp, err = os.MkdirTemp("", "okso-nats-"); err != nil {
			return nil, fmt.Errorf("jetstream store dir: %w", err)
		}
		o.StoreDir = filepath.Join(s.tmp, "jetstream")
	}
	ns, err := server.NewServer(o)
	if err != nil {
		s.release()
		return nil, fmt.Errorf("start embedded nats: %w", err)
	}
	// nats-server says why it cannot start only in its log, and then
	// never gets ready.
	l := &serverLog{fatal: make(chan string, 1), log: opts.Log}
	ns.SetLoggerV2(l, false, false, false)
	ns.Start()
	if err := ready(ns, l.fatal, 10*time.Second); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		s.release()
		return nil, fmt.Errorf("start embedded nats: %w", err)
	}
	l.started.Store(true)
	select {
	case msg := <-l.fatal: // between ready and now
		l.Fatalf("%s", msg)
	default:
	}
	s.ns, s.creds = ns, opts.Credentials
	return s, nil
}

// checkAccounts moves an older okso's revocations and bindings out of
// the global account of the store, before a server with okso's accounts
// starts on it; a clustered one cannot read them alone, and says so
// (also a server without accounts on a store that has them).
func (s *Server) checkAccounts(opts ServerOptions) error {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch old, state := oksoStreams(s.store, globalAccount), oksoStreams(s.store, AccountState); {
	case opts.Credentials == nil && len(state) > 0:
		log.Warn("this NATS store holds okso's buckets of the roles' accounts, which a server without them "+
			"(--nats-insecure) does not see: revocations made then are not in force now", "store", s.store)
	case opts.Credentials != nil && len(old) > 0 && opts.Cluster.Listen != "":
		log.Error("this NATS store holds an older okso's buckets in the global account, which a clustered server "+
			"cannot move alone: the tokens revoked before are not revoked now (revoke them again), and node ids "+
			"bound to tenants are free again", "store", s.store, "buckets", old)
	case opts.Credentials != nil && len(old) > 0:
		if err := moveOutOfGlobal(s.store, log); err != nil {
			return fmt.Errorf("move an older okso's revocations and node bindings out of NATS's global account: %w", err)
		}
	}
	return nil
}

// ready waits until ns accepts connections, for up to d, or until it
// reports a fatal error on fatal.
func ready(ns *server.Server, fatal <-chan string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-fatal:
			return errors.New(msg)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", d)
		}
	}
	return nil
}

// serverLog is an embedded server's logger: it hands the first fatal
// error to StartServer while the server starts, and logs fatal errors
// after that to log, if set.
type serverLog struct {
	fatal   chan string // capacity 1
	started atomic.Bool
	log     *slog.Logger
}

func (l *serverLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if !l.started.Load() {
		select {
		case l.fatal <- msg:
		default: // one reason is enough
		}
		return
	}
	if l.log != nil {
		l.log.Error("embedded nats", "err", msg)
	}
}

func (*serverLog) Noticef(string, ...any) {}
func (*serverLog) Warnf(string, ...any)   {}

// Errorf logs, as a warning, a route refused for its credential or its
// TLS: a cluster member with another data dir's route secret, or a
// certificate the others do not trust, would otherwise fail silently.
// The server's other errors (a member gone, a client's error) are
// dropped.
func (l *serverLog) Errorf(format string, v ...any) {
	if l.log == nil {
		return
	}
	msg := fmt.Sprintf(format, v...)
	if !strings.Contains(msg, "rid:") { // not a route's
		return
	}
	for _, why := range []string{"authentication error", "Authorization Violation", "TLS", "certificate"} {
		if strings.Contains(msg, why) {
			l.log.Warn("nats route refused: the cluster's members need one route secret (the same <data-dir>/nats/creds) "+
				"and certificates that --nats-ca trusts", "detail", msg)
			return
		}
	}
}

func (*serverLog) Debugf(string, ...any) {}
func (*serverLog) Tracef(string, ...any) {}

// splitHostPort parses host:port; port 0 means any free port.
func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("%q: bad port", addr)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	}
	return host, p, nil
}

// ClusterURL returns the nats-route:// URL other members route to, or ""
// when the server is not clustered.
func (s *Server) ClusterURL() string {
	if a := s.ns.ClusterAddr(); a != nil {
		return "nats-route://" + a.String()
	}
	return ""
}

// ClientURL returns the nats:// URL other processes can connect to, or ""
// when the server does not listen.
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect opens an in-process connection to s, as the admin when s has
// credentials. Its writes have no deadline (nats.go's flusher timeout):
// they go to the server's own reader through an in-memory pipe, which a
// stopping server closes, and a deadline there costs a timer per flush.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	return s.ConnectAs(RoleAdmin, name)
}

// ConnectAs is [Server.Connect] for role: with its credential, when s has
// credentials, and its own reply subjects ([Role.InboxPrefix]).
func (s *Server) ConnectAs(role Role, name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.InProcessServer(s.ns), nats.Name(name), nats.MaxReconnects(-1), nats.FlusherTimeout(0)}
	if s.creds != nil {
		opts = append(opts, s.creds.Option(role))
	}
	if p := role.InboxPrefix(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("connect in-process nats as %s: %w", name, err)
	}
	return nc, nil
}

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.release()
}

// release removes the temporary store and lets go of the store's lock.
func (s *Server) release() {
	if s.tmp != "" {
		_ = os.RemoveAll(s.tmp)
	}
	if s.lock != nil {
		_ = s.lock.Close()
	}
}

// A connection to a NATS server in another process pings it every
// PingInterval and counts the link dead after MaxPingsOutstanding pings
// go unanswered: a link that went silent (a partition, a blackholed
// route) is noticed within PingInterval × (MaxPingsOutstanding + 1),
// 9 s, rather than nats.go's default of minutes, and the connection then
// reconnects (and okso's roles say they are unready meanwhile).
const (
	PingInterval        = 3 * time.Second
	MaxPingsOutstanding = 2
)

// ClientOptions say how a connection to a NATS server in another process
// authenticates, and whom it acts for. The zero value connects as
// nobody in particular, with NATS's default reply subjects.
type ClientOptions struct {
	// Role names the connection's reply subjects ([Role.InboxPrefix]):
	// its credential's permissions allow only its own.
	Role Role
	// NkeyFile is a seed file (--nats-nkey; what okso nats creds
	// prints), read once: the connection keeps its key, through
	// reconnects, until the process restarts (a rotation admits the old
	// key meanwhile, see [RotateCredential]); CredsFile a NATS user
	// credentials file, JWT and seed (--nats-creds), read at each
	// connect as nats.go does. At most one of them.
	NkeyFile, CredsFile string
	// TLS, when set, is the client's TLS configuration (its RootCAs from
	// --nats-ca); a server that asks for TLS gets it either way.
	TLS *tls.Config
}

func (o ClientOptions) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case o.NkeyFile != "" && o.CredsFile != "":
		return nil, errors.New("a nats nkey and a nats credentials file: give one of them")
	case o.NkeyFile != "":
		b, err := os.ReadFile(o.NkeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey: %w", err)
		}
		kp, err := nkeys.ParseDecoratedUserNKey(b)
		if err != nil {
			return nil, fmt.Errorf("nats nkey %s: %w", o.NkeyFile, err)
		}
		pub, _ := kp.PublicKey()
		opts = append(opts, nats.Nkey(pub, kp.Sign))
	case o.CredsFile != "":
		if _, err := os.Stat(o.CredsFile); err != nil {
			return nil, fmt.Errorf("nats credentials: %w", err)
		}
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if p := o.Role.InboxPrefix(); p != "" {
		opts = append(opts, nats.CustomInboxPrefix(p))
	}
	if o.TLS != nil {
		opts = append(opts, nats.Secure(o.TLS))
	}
	return opts, nil
}

// tlsTimeout bounds a TLS handshake on the embedded server's listeners
// (nats-server's default, half a second, is short for a loaded host).
const tlsTimeout = 5 // seconds

// ConnectURL connects to an external NATS server or cluster (url may list
// several servers, comma separated) as o says; once connected it
// reconnects for ever, with jittered waits.
func ConnectURL(url, name string, o ClientOptions) (*nats.Conn, error) {
	auth, err := o.options()
	if err != nil {
		return nil, err
	}
	opts := append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectJitter(500*time.Millisecond, time.Second),
		nats.PingInterval(PingInterval), nats.MaxPingsOutstanding(MaxPingsOutstanding),
		nats.RetryOnFailedConnect(false), nats.SetCustomDialer(&rawDialer{net.Dialer{Timeout: nats.DefaultTimeout}})}, auth...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s as %s: %w", url, name, err)
	}
	return nc, nil
}

// rawDialer dials NATS as nats.go does, for connections whose reads and
// writes do not wake the runtime's monitor thread (internal/rawio).
type rawDialer struct{ net.Dialer }

func (d *rawDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := d.Dialer.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	return rawio.Wrap(c), nil
}
