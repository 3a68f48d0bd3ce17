package certfile_test

import (
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/internal/certfile"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// TestBundleReload: a server that trusts the CAs of a bundle file for its
// clients' certificates trusts, after the file changes, the new CAs and
// no longer the old, without a restart; a bad file keeps the last good
// CAs with one warning.
func TestBundleReload(t *testing.T) {
	dir := t.TempDir()
	server := certtest.NewCA(t)
	certFile, keyFile := server.WriteLeaf(t, dir, 1)
	pair, err := certfile.Load(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldCA, newCA := certtest.NewCA(t), certtest.NewCA(t)
	bundleFile := filepath.Join(dir, "clients-ca.pem")
	writeCA := func(ca *certtest.CA) {
		t.Helper()
		if err := os.WriteFile(bundleFile, ca.PEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCA(oldCA)
	var logs syncBuffer
	b, err := certfile.LoadBundle(bundleFile, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Now()}
	certfile.SetBundleClock(b, c.now)
	addr := serveTLS(t, &tls.Config{GetConfigForClient: b.ServerConfig(&tls.Config{GetCertificate: pair.GetCertificate})})
	oldClient := clientCert(t, oldCA, dir, "01hzx9k3m4p7q8r9s0t1v2w3xy")
	newClient := clientCert(t, newCA, dir, "01hzx9k3m4p7q8r9s0t1v2w3xz")
	accepted := func(cert tls.Certificate) bool {
		t.Helper()
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
			&tls.Config{RootCAs: server.Pool(), Certificates: []tls.Certificate{cert}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// TLS 1.3: the server's verdict on the client's certificate comes
		// with the first read.
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		return err != nil && !strings.Contains(err.Error(), "certificate")
	}
	if !accepted(oldClient) || accepted(newClient) {
		t.Fatal("at start: want the old CA's client alone")
	}
	writeCA(newCA)
	if !accepted(oldClient) {
		t.Fatal("before CheckEvery passed, the old CA's client is refused")
	}
	c.tick()
	if accepted(oldClient) || !accepted(newClient) {
		t.Fatal("after the file changed: want the new CA's client alone")
	}
	if err := os.WriteFile(bundleFile, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c.tick()
		if !accepted(newClient) {
			t.Fatal("a bad file: the last good CAs are not trusted any more")
		}
	}
	if n := strings.Count(logs.String(), "tls CA bundle not reloaded"); n != 1 {
		t.Errorf("%d warnings of one bad file, want 1:\n%s", n, logs.String())
	}
}

func clientCert(t *testing.T, ca *certtest.CA, dir, node string) tls.Certificate {
	t.Helper()
	certFile, keyFile := ca.WriteDevice(t, dir, node)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
