package roles

import (
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oklog/run"

	"github.com/okso-io/okso/internal/certfile"
	"github.com/okso-io/okso/internal/rawio"
)

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
		ln = &limitListener{Listener: ln, sem: make(chan struct{}, maxConns), done: make(chan struct{})}
	}
	return &httpPart{ln: ln}, nil
}

// limitListener holds at most cap(sem) connections at once: Accept waits
// for one to close first. It is netutil.LimitListener's, but for its
// connections, which keep their socket's SyscallConn: a device tier reads
// an idle device's socket directly (see the tier's idleConn).
type limitListener struct {
	net.Listener
	sem       chan struct{}
	closeOnce sync.Once
	done      chan struct{} // closed by Close
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: rawio.Wrap(c), release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// limitConn gives its place back when it closes.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// SyscallConn is the socket's, when the connection is one.
func (c *limitConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
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
		p.actor(g, nil)
	}
}

// actor adds the server to g, serving once every ready channel is closed
// (none: at once); before is called on interrupt, before the HTTP server stops
// accepting.
func (p *httpPart) actor(g *run.Group, before func(context.Context), ready ...<-chan struct{}) {
	stop := make(chan struct{})
	g.Add(func() error {
		for _, r := range ready {
			select {
			case <-r:
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
