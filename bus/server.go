package bus

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerOptions configures an embedded NATS server. The zero value runs a
// JetStream-enabled server that accepts only in-process connections and
// keeps JetStream data in memory.
type ServerOptions struct {
	// Listen, when set (host:port, port 0 for any), also exposes the server
	// to other processes over TCP.
	Listen string
	// StoreDir, when set, is where JetStream keeps file-backed data.
	StoreDir string
}

// Server is a running embedded nats-server.
type Server struct {
	ns  *server.Server
	tmp string // removed on Shutdown
}

// StartServer starts an embedded nats-server and waits until it accepts
// connections. NoSigs is always on, so signals stay with okso.
func StartServer(opts ServerOptions) (*Server, error) {
	o := &server.Options{
		ServerName: "okso",
		JetStream:  true,
		NoSigs:     true,
		NoLog:      true,
		DontListen: opts.Listen == "",
		StoreDir:   opts.StoreDir,
	}
	var tmp string
	if o.StoreDir == "" {
		// JetStream needs a directory even when every stream okso creates is
		// in memory; give each server its own so processes never share one.
		var err error
		if tmp, err = os.MkdirTemp("", "okso-nats-"); err != nil {
			return nil, fmt.Errorf("jetstream store dir: %w", err)
		}
		o.StoreDir = filepath.Join(tmp, "jetstream")
	}
	if opts.Listen != "" {
		host, port, err := net.SplitHostPort(opts.Listen)
		if err != nil {
			return nil, fmt.Errorf("nats listen address %q: %w", opts.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("nats listen port %q: %w", port, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		o.Host, o.Port = host, p
	}
	ns, err := server.NewServer(o)
	if err != nil {
		removeAll(tmp)
		return nil, fmt.Errorf("start embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		removeAll(tmp)
		return nil, errors.New("start embedded nats: not ready after 10s")
	}
	return &Server{ns: ns, tmp: tmp}, nil
}

// ClientURL returns the nats:// URL other processes can connect to, or ""
// when the server does not listen.
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect opens an in-process connection to s.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect("", nats.InProcessServer(s.ns), nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect in-process nats as %s: %w", name, err)
	}
	return nc, nil
}

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	removeAll(s.tmp)
}

func removeAll(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// ConnectURL connects to an external NATS server or cluster; it keeps
// reconnecting for ever once connected.
func ConnectURL(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(false))
	if err != nil {
		return nil, fmt.Errorf("connect nats %s as %s: %w", url, name, err)
	}
	return nc, nil
}
