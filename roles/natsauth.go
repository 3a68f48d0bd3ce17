package roles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/bus"
)

// natsSecurity is how a role's NATS is secured (DESIGN.md §6): an
// embedded server admits okso's roles alone, each with its credential
// and permissions, unless Insecure, and serves TLS with TLS; a
// connection to an external NATS authenticates with Nkey or Creds and
// trusts CA.
type natsSecurity struct {
	Insecure bool     // --nats-insecure
	TLS      tlsFiles // --nats-tls-cert, --nats-tls-key
	CA       string   // --nats-ca
	Nkey     string   // --nats-nkey
	Creds    string   // --nats-creds
}

// addNATSServerFlags adds the flags that secure an embedded NATS server.
func addNATSServerFlags(fs *pflag.FlagSet, s *natsSecurity) {
	fs.BoolVar(&s.Insecure, "nats-insecure", false, "let anyone who reaches the embedded NATS server connect and do anything, "+
		"with no credential (for experiments only: a warning says so at every start)")
	fs.StringVar(&s.TLS.Cert, "nats-tls-cert", "", "serve the embedded NATS server's client and route ports over TLS with this PEM certificate (chain), "+
		"reloaded when it changes; with --nats-tls-key")
	fs.StringVar(&s.TLS.Key, "nats-tls-key", "", "PEM private key of --nats-tls-cert")
}

// addNATSFlags' security half: the embedded server's, and the client's
// of an external NATS.
func addNATSSecurityFlags(fs *pflag.FlagSet, s *natsSecurity) {
	addNATSServerFlags(fs, s)
	addNATSClientFlags(fs, s)
}

func addNATSClientFlags(fs *pflag.FlagSet, s *natsSecurity) {
	fs.StringVar(&s.CA, "nats-ca", "", "PEM bundle of CA certificates trusted for NATS over TLS (--nats-url, and the routes of the embedded server), "+
		"besides the system's roots")
	fs.StringVar(&s.Nkey, "nats-nkey", "", "with --nats-url: connect with this NATS nkey seed file (okso nats creds prints it; "+
		"default: this role's in <data-dir>/nats/creds, if there)")
	fs.StringVar(&s.Creds, "nats-creds", "", "with --nats-url: connect with this NATS user credentials file (JWT and seed)")
}

// check refuses flags that do not go together.
func (s natsSecurity) check(c natsConfig) error {
	switch {
	case c.URL == "" && (s.Nkey != "" || s.Creds != ""):
		return errors.New("--nats-nkey and --nats-creds go with --nats-url: in-process connections to the embedded server need no credential file")
	case s.Nkey != "" && s.Creds != "":
		return errors.New("--nats-nkey and --nats-creds: give one of them")
	case c.URL != "" && (s.Insecure || s.TLS != tlsFiles{}):
		return errors.New("--nats-insecure, --nats-tls-cert and --nats-tls-key are the embedded server's: with --nats-url, secure your NATS servers themselves")
	case c.URL == "" && c.Addr == "" && s.CA != "":
		return errors.New("--nats-ca: nothing here dials NATS over TLS (it goes with --nats-url or --nats-cluster-addr)")
	case c.Listen == "" && s.TLS != tlsFiles{}:
		return errors.New("--nats-tls-cert needs --nats-listen: the embedded server has no port to serve TLS on")
	}
	return nil
}

// clientOptions are the options of connections to an external NATS.
func (c natsConfig) clientOptions() (bus.ClientOptions, error) {
	o := bus.ClientOptions{NkeyFile: c.Nkey, CredsFile: c.Creds}
	for _, f := range []string{c.Nkey, c.Creds} {
		if f != "" {
			if _, err := os.Stat(f); err != nil {
				return o, fmt.Errorf("nats credential: %w", err)
			}
		}
	}
	if c.CA != "" {
		pool, err := caPool("--nats-ca", c.CA)
		if err != nil {
			return o, err
		}
		o.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return o, nil
}

// serverSecurity returns the embedded server's credentials (nil with
// --nats-insecure) and TLS configuration (nil without --nats-tls-cert).
// The credentials are the data dir's, made on its first start; without a
// data dir they live in memory, for this process alone.
func (c natsConfig) serverSecurity() (*bus.Credentials, *tls.Config, error) {
	var creds *bus.Credentials
	if !c.Insecure {
		var err error
		if c.DataDir != "" {
			creds, err = bus.LoadCredentials(bus.CredentialsDir(c.DataDir))
		} else {
			creds, err = bus.NewCredentials()
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if c.TLS == (tlsFiles{}) {
		return creds, nil, nil
	}
	pair, err := c.TLS.load(c.Log, "--nats-tls")
	if err != nil {
		return nil, nil, err
	}
	conf := &tls.Config{GetCertificate: pair.GetCertificate, MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		if conf.RootCAs, err = caPool("--nats-ca", c.CA); err != nil {
			return nil, nil, err
		}
	}
	return creds, conf, nil
}

// warn logs, at every start, what the embedded server leaves open.
func (c natsConfig) warn(srv *bus.Server) {
	if c.Log == nil {
		return
	}
	if c.Insecure {
		c.Log.Warn("--nats-insecure: the embedded NATS server lets anyone who reaches it connect with no credential and do anything: "+
			"call any tenant's devices, forge registry records, delete revocations, read every audit event",
			"nats_url", srv.ClientURL(), "nats_route_url", srv.ClusterURL())
	}
	if c.TLS != (tlsFiles{}) {
		return
	}
	if c.Listen != "" && !loopback(c.Listen) {
		c.Log.Warn("the embedded NATS server listens for clients without TLS on an address other hosts can reach: "+
			"their credentials are not sent (nkeys answer a challenge), but calls, results and registry records cross "+
			"the network in plain text (give --nats-tls-cert and --nats-tls-key)", "addr", c.Listen)
	}
	if c.Addr != "" && !loopback(c.Addr) {
		c.Log.Warn("the embedded NATS server's routes run without TLS on an address other hosts can reach: the route "+
			"secret, which makes a server a full member of the cluster, crosses the network in plain text, with "+
			"everything else (give --nats-tls-cert and --nats-tls-key)", "addr", c.Addr)
	}
}

// loopback reports whether host:port names a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// connect opens a connection of role to p's NATS. To an external NATS, a
// role with no credential of its own (--nats-nkey, --nats-creds) uses
// its seed in the data dir, if there, unless that NATS takes no nkeys.
func (p *natsPart) connect(role bus.Role, name string) (*nats.Conn, error) {
	if p.srv != nil {
		return p.srv.ConnectAs(role, name)
	}
	o := p.client
	o.Role = role
	p.credentialed = o.NkeyFile != "" || o.CredsFile != ""
	if !p.credentialed && p.dataDir != "" {
		seed := filepath.Join(bus.CredentialsDir(p.dataDir), bus.SeedFileName(role))
		if _, err := os.Stat(seed); err == nil {
			o.NkeyFile = seed
			nc, err := bus.ConnectURL(p.url, name, o)
			if !errors.Is(err, nats.ErrNkeysNotSupported) {
				p.credentialed = err == nil
				return nc, refused(err, role)
			}
			o.NkeyFile = "" // a NATS of another kind
			if p.log != nil {
				p.log.Warn("the NATS at --nats-url takes no nkeys: connecting without this role's credential", "nats_url", p.url, "role", role)
			}
		}
	}
	nc, err := bus.ConnectURL(p.url, name, o)
	return nc, refused(err, role)
}

// refused says what to do when NATS refuses role's credential.
func refused(err error, role bus.Role) error {
	if err != nil && (errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")) {
		return fmt.Errorf("%w (NATS wants a credential of role %s: give --nats-nkey FILE, which okso nats creds --role %s "+
			"prints from the data dir of the okso process that embeds it, or --nats-creds FILE)", err, role, role)
	}
	return err
}

// natsCmd is okso nats: the credentials of okso's roles on NATS.
func natsCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "nats", Short: "Print the NATS credentials of okso's roles, and a NATS server's configuration for them"}
	var (
		role    string
		dataDir string
		public  bool
	)
	creds := &cobra.Command{
		Use:   "creds",
		Short: "Print a role's NATS credential (an nkey seed file, for --nats-nkey), making the data dir's credentials if it has none",
		Long: "okso nats creds prints the nkey seed with which a process of --role connects to the NATS that\n" +
			"an okso process embeds with the same --data-dir (or to a NATS configured by okso nats\n" +
			"server-config). Keep it secret: it lets its holder act on NATS as that role. Roles:\n" +
			"  gateway  okso gateway: calls devices, upstreams and agents' tools\n" +
			"  device   okso device: serves devices' calls, writes the registry\n" +
			"  remote   okso remote: serves federated upstreams' calls\n" +
			"  audit    reads the audit events (okso.v1.audit.>, stream okso_audit), nothing else\n" +
			"  admin    anything: okso token revoke, and an operator's own tools",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := roleFlag(role)
			if err != nil {
				return err
			}
			c, err := bus.LoadCredentials(bus.CredentialsDir(dataDir))
			if err != nil {
				return err
			}
			if public {
				_, err := fmt.Fprintln(stdout, c.PublicKey(r))
				return err
			}
			b, err := c.SeedFile(r)
			if err != nil {
				return err
			}
			_, err = stdout.Write(b)
			return err
		},
	}
	creds.Flags().StringVar(&role, "role", "", "the role: "+roleNames())
	creds.Flags().BoolVar(&public, "public", false, "print the role's public key alone (not a secret), for a NATS server's configuration")
	creds.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "data dir of the okso processes that embed NATS (the credentials are in <data-dir>/nats/creds)")
	var confDir string
	serverConfig := &cobra.Command{
		Use:   "server-config",
		Short: "Print the accounts block of a nats-server configuration that admits okso's roles, each with its permissions",
		Long: "okso nats server-config prints the accounts block of a nats-server configuration file for a NATS\n" +
			"that okso does not embed (and the one okso's embedded servers load): one nkey user per role\n" +
			"(public keys only) with that role's permissions, in account OKSO; okso's buckets in account STATE,\n" +
			"which no client is in. Include it in the servers' configuration (with JetStream on), run okso nats\n" +
			"init, and give each okso process its role's seed (okso nats creds).",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			c, err := bus.LoadCredentials(bus.CredentialsDir(confDir))
			if err != nil {
				return err
			}
			conf, err := c.ServerConfig()
			if err != nil {
				return err
			}
			_, err = io.WriteString(stdout, conf)
			return err
		},
	}
	serverConfig.Flags().StringVar(&confDir, "data-dir", defaultDataDir(), "data dir that keeps the credentials (<data-dir>/nats/creds)")
	var (
		rotateRole string
		rotateDir  string
	)
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Give a role a new NATS credential, keeping the old one admitted until the rotation is rolled out",
		Long: "okso nats rotate makes a new seed for --role in <data-dir>/nats/creds and keeps the old\n" +
			"public key in <data-dir>/nats/creds/retired, so that NATS servers that load the credentials\n" +
			"next admit both, with the role's permissions. Then: copy the data dir's nats/creds to every\n" +
			"okso process that embeds NATS and restart them one by one (for a NATS okso does not embed,\n" +
			"load okso nats server-config again); give the role's processes the new seed (okso nats\n" +
			"creds) and restart them; delete the retired key and restart the NATS servers once more.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := roleFlag(rotateRole)
			if err != nil {
				return err
			}
			pub, err := bus.RotateCredential(bus.CredentialsDir(rotateDir), r)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "new NATS credential of %s: public key %s\n", r, pub)
			return err
		},
	}
	rotate.Flags().StringVar(&rotateRole, "role", "", "the role: "+roleNames())
	rotate.Flags().StringVar(&rotateDir, "data-dir", defaultDataDir(), "data dir that keeps the credentials (<data-dir>/nats/creds)")
	cmd.AddCommand(creds, serverConfig, rotate, natsInitCmd(stdout))
	return cmd
}

// natsInitCmd is okso nats init: okso's buckets on a NATS okso does not
// embed, made by the admin.
func natsInitCmd(stdout io.Writer) *cobra.Command {
	var (
		c     natsConfig
		audit time.Duration
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Make okso's buckets (and its audit stream) on a NATS that okso does not embed, as the admin",
		Long: "okso nats init makes okso's JetStream buckets on the NATS of --nats-url, with the admin's\n" +
			"credential, or brings those an older okso made to what this one needs. On a NATS that\n" +
			"admits okso's roles alone (okso nats server-config), the roles may not make them: run it once,\n" +
			"before they start. An okso process that embeds NATS does it itself.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.URL == "" {
				return errors.New("--nats-url is required: the NATS of the gateways and tiers")
			}
			np, nc, err := adminConn(contextOf(cmd), c, "okso-nats-init")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := startContext(contextOf(cmd))
			defer cancel()
			if err := makeState(ctx, slog.New(slog.DiscardHandler), nc, np.replicas, audit); err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "okso's buckets are ready on %s (%d replicas)\n", c.URL, np.replicas)
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&c.URL, "nats-url", "", "the NATS server or cluster (comma separated URLs)")
	fs.IntVar(&c.Replicas, "registry-replicas", 1, "replicas of okso's buckets (3 on a cluster of 3 servers or more)")
	fs.DurationVar(&audit, "audit-retention", 0, "also keep audit events (okso.v1.audit.>) in the stream okso_audit this long")
	fs.StringVar(&c.DataDir, "data-dir", defaultDataDir(), "data dir whose admin NATS credential (nats/creds/admin.nk) is used without --nats-nkey or --nats-creds")
	addNATSClientFlags(fs, &c.natsSecurity)
	return cmd
}

// roleFlag is the role --role names.
func roleFlag(s string) (bus.Role, error) {
	r, ok := bus.ParseRole(s)
	if !ok {
		return "", fmt.Errorf("--role %q: want one of %s", s, roleNames())
	}
	return r, nil
}

// roleNames lists okso's roles on NATS.
func roleNames() string {
	names := make([]string, len(bus.Roles))
	for i, r := range bus.Roles {
		names[i] = string(r)
	}
	return strings.Join(names, ", ")
}

// adminConn connects to the external NATS of c as the admin, named name.
func adminConn(ctx context.Context, c natsConfig, name string) (*natsPart, *nats.Conn, error) {
	np, err := openNATS(ctx, c)
	if err != nil {
		return nil, nil, err
	}
	nc, err := np.connect(bus.RoleAdmin, name)
	if err != nil {
		return nil, nil, err
	}
	return np, nc, nil
}

// makeState makes okso's buckets (and the audit stream, when audit is
// above zero) on nc, the admin's, waiting for JetStream as a role's start
// does ([bus.InitState]).
func makeState(ctx context.Context, log *slog.Logger, nc *nats.Conn, replicas int, audit time.Duration) error {
	_, err := whileJetStreamForms(ctx, log, nc, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, bus.InitState(ctx, nc, bus.StateOptions{Replicas: replicas, AuditRetention: audit, Log: log})
	})
	if err != nil {
		return fmt.Errorf("make okso's buckets: %w", err)
	}
	return nil
}
