package certfile_test

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/okso-io/okso/internal/certfile"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// serve serves TLS with p on 127.0.0.1 until the test ends and returns
// the address.
func serve(t *testing.T, p *certfile.Pair) string {
	t.Helper()
	return serveTLS(t, &tls.Config{GetCertificate: p.GetCertificate})
}

// serveTLS serves TLS with conf on 127.0.0.1 until the test ends,
// closing each connection once its handshake is done, and returns the
// address.
func serveTLS(t *testing.T, conf *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { _ = c.(*tls.Conn).Handshake(); _ = c.Close() })
		}
	})
	return ln.Addr().String()
}

// serial is the serial of the certificate addr serves.
func serial(t *testing.T, addr string, ca *certtest.CA) int64 {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// clock is a test's clock: it moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// tick moves the clock past CheckEvery: the next handshake looks at the
// files again.
func (c *clock) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(certfile.CheckEvery)
}

// next is the serial served by the first handshake after the clock moved
// past CheckEvery.
func next(t *testing.T, c *clock, addr string, ca *certtest.CA) int64 {
	t.Helper()
	c.tick()
	return serial(t, addr, ca)
}

// syncBuffer is a log's destination the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReload: a pair written over the files is served by the next
// handshakes without a restart; a bad pair keeps the last good one with
// one warning, and a good one after it is taken again.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 100)
	var logs syncBuffer
	p, err := certfile.Load(certFile, keyFile, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Now()}
	certfile.SetClock(p, c.now)
	addr := serve(t, p)
	if got := serial(t, addr, ca); got != 100 {
		t.Fatalf("serial %d, want 100", got)
	}

	ca.WriteLeaf(t, dir, 101)
	if got := serial(t, addr, ca); got != 100 {
		t.Fatalf("serial %d before CheckEvery passed, want 100 still", got)
	}
	if got := next(t, c, addr, ca); got != 101 {
		t.Fatalf("serial %d after the files changed, want 101", got)
	}

	if err := os.WriteFile(certFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Three checks of the same bad pair: the last good one is served, and
	// one warning is logged.
	for range 3 {
		if got := next(t, c, addr, ca); got != 101 {
			t.Fatalf("serial %d after a bad pair, want the last good one, 101", got)
		}
	}
	if n := strings.Count(logs.String(), "tls certificate not reloaded"); n != 1 {
		t.Errorf("%d warnings of one bad pair, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), certFile) {
		t.Errorf("the warning does not name %s:\n%s", certFile, logs.String())
	}

	ca.WriteLeaf(t, dir, 102)
	if got := next(t, c, addr, ca); got != 102 {
		t.Fatalf("serial %d after a good pair again, want 102", got)
	}
}

// TestLoadErrors: a pair that does not load is an error naming the file
// at fault.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherCert, _ := ca.Leaf(t, 2)
	other := filepath.Join(dir, "other.pem")
	if err := os.WriteFile(other, otherCert, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct{ name, cert, key, names string }{
		{"missing cert", missing, keyFile, missing},
		{"missing key", certFile, missing, missing},
		{"bad cert", bad, keyFile, bad},
		{"bad key", certFile, bad, bad},
		{"key of another cert", other, keyFile, keyFile},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := certfile.Load(c.cert, c.key, nil)
			if err == nil || !strings.Contains(err.Error(), c.names) {
				t.Errorf("Load(%s, %s) = %v, want an error naming %s", c.cert, c.key, err, c.names)
			}
		})
	}
}
