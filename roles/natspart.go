package roles

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/okso-io/okso/bus"
)

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
