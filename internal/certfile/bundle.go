package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Bundle is a pool of CA certificates kept in one PEM file and reloaded
// when the file's modification time or size changes (looked at, at most,
// once per CheckEvery, on a handshake): the CAs a server trusts to sign
// its clients' certificates (mTLS), renewed or extended on disk without
// a restart. A file that fails to load keeps the last good pool and logs
// one warning, until it changes again. A Bundle is safe for concurrent
// use.
type Bundle struct {
	file string
	log  *slog.Logger

	mu      sync.Mutex
	pool    *x509.CertPool
	stamp   stamp // of the file pool was loaded from (cert fields only)
	bad     stamp
	checked time.Time
	now     func() time.Time
}

// LoadBundle loads the PEM bundle file; log gets the warning of a reload
// that fails (nil: slog's default). An error names the file.
func LoadBundle(file string, log *slog.Logger) (*Bundle, error) {
	if log == nil {
		log = slog.Default()
	}
	b := &Bundle{file: file, log: log, now: time.Now}
	st, err := b.stat()
	if err != nil {
		return nil, err
	}
	pool, err := b.load()
	if err != nil {
		return nil, err
	}
	b.pool, b.stamp, b.checked = pool, st, b.now()
	return b, nil
}

// Pool returns the bundle's current pool, reloaded first if the file
// changed.
func (b *Bundle) Pool() *x509.CertPool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if now.Sub(b.checked) < CheckEvery {
		return b.pool
	}
	b.checked = now
	st, err := b.stat()
	if err != nil {
		st = stamp{certSize: -1} // missing: warned once, until it is back
	}
	if st == b.stamp || st == b.bad {
		return b.pool
	}
	if err == nil {
		var pool *x509.CertPool
		if pool, err = b.load(); err == nil {
			b.pool, b.stamp, b.bad = pool, st, stamp{}
			b.log.Info("tls CA bundle reloaded", "file", b.file)
			return b.pool
		}
	}
	b.bad = st
	b.log.Warn("tls CA bundle not reloaded: trusting the last good one", "err", err)
	return b.pool
}

// ServerConfig returns base for each handshake (tls.Config's
// GetConfigForClient) with ClientCAs the bundle's current pool and
// client certificates required: base itself is not changed.
func (b *Bundle) ServerConfig(base *tls.Config) func(*tls.ClientHelloInfo) (*tls.Config, error) {
	return func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs, c.ClientAuth = b.Pool(), tls.RequireAndVerifyClientCert
		return c, nil
	}
}

func (b *Bundle) stat() (stamp, error) {
	fi, err := os.Stat(b.file)
	if err != nil {
		return stamp{}, fmt.Errorf("tls CA bundle: %w", err)
	}
	return stamp{certMod: fi.ModTime(), certSize: fi.Size()}, nil
}

// load reads the file: its CAs alone, not the system's.
func (b *Bundle) load() (*x509.CertPool, error) {
	data, err := os.ReadFile(b.file)
	if err != nil {
		return nil, fmt.Errorf("tls CA bundle: %w", err)
	}
	if err := checkCertPEM(data); err != nil {
		return nil, fmt.Errorf("tls CA bundle %s: %w", b.file, err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(data)
	return pool, nil
}
