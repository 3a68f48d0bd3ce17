// Package certfile serves a TLS certificate kept in a pair of PEM files
// and follows the files as they change, so a certificate renewed on disk
// (by cert-manager, certbot, an operator's cp) is used by the next
// connection without a restart. Start with [Load], then give
// [Pair.GetCertificate] (a server's) or [Pair.GetClientCertificate] (a
// client's, for mTLS) to a tls.Config.
package certfile

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// CheckEvery is how often, at most, a Pair looks at its files again.
const CheckEvery = time.Second

// Pair is a certificate and its key, loaded from two files and reloaded
// when either file's modification time or size changes (looked at, at
// most, once per CheckEvery, on a handshake). A pair that fails to load
// keeps the last good certificate and logs one warning, until the files
// change again. A Pair is safe for concurrent use.
type Pair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   stamp // of the files cert was loaded from
	bad     stamp // of the files that last failed to load, once warned
	checked time.Time
	now     func() time.Time // time.Now; a test's clock
}

// stamp is what tells that a pair of files changed.
type stamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// Load loads the pair certFile, keyFile; log gets the warning of a reload
// that fails (nil: slog's default). An error names the file at fault.
func Load(certFile, keyFile string, log *slog.Logger) (*Pair, error) {
	if log == nil {
		log = slog.Default()
	}
	p := &Pair{certFile: certFile, keyFile: keyFile, log: log, now: time.Now}
	st, err := p.stat()
	if err != nil {
		return nil, err
	}
	cert, err := p.load()
	if err != nil {
		return nil, err
	}
	p.cert, p.stamp, p.checked = cert, st, p.now()
	return p, nil
}

// GetCertificate is for tls.Config.GetCertificate: the pair's current
// certificate, reloaded first if the files changed.
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if now.Sub(p.checked) < CheckEvery {
		return p.cert, nil
	}
	p.checked = now
	st, err := p.stat()
	if err != nil {
		st = stamp{certSize: -1} // missing: warned once, until they are back
	}
	if st == p.stamp || st == p.bad {
		return p.cert, nil
	}
	if err == nil {
		var cert *tls.Certificate
		if cert, err = p.load(); err == nil {
			p.cert, p.stamp, p.bad = cert, st, stamp{}
			p.log.Info("tls certificate reloaded", "cert", p.certFile, "serial", cert.Leaf.SerialNumber.String(),
				"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
			return p.cert, nil
		}
	}
	p.bad = st
	p.log.Warn("tls certificate not reloaded: serving the last good one", "err", err)
	return p.cert, nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate: the
// certificate a client presents when a server asks for one (mTLS),
// reloaded first if the files changed.
func (p *Pair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return p.GetCertificate(nil)
}

func (p *Pair) stat() (stamp, error) {
	c, err := os.Stat(p.certFile)
	if err != nil {
		return stamp{}, fmt.Errorf("tls certificate: %w", err)
	}
	k, err := os.Stat(p.keyFile)
	if err != nil {
		return stamp{}, fmt.Errorf("tls key: %w", err)
	}
	return stamp{certMod: c.ModTime(), keyMod: k.ModTime(), certSize: c.Size(), keySize: k.Size()}, nil
}

// load reads and parses the pair; its error names the file at fault.
func (p *Pair) load() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(p.certFile)
	if err != nil {
		return nil, fmt.Errorf("tls certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(p.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls key: %w", err)
	}
	if err := checkCertPEM(certPEM); err != nil {
		return nil, fmt.Errorf("tls certificate %s: %w", p.certFile, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls key %s (of certificate %s): %w", p.keyFile, p.certFile, err)
	}
	return &cert, nil
}

// checkCertPEM says whether b holds a certificate chain, so that a bad
// pair's error names the file at fault.
func checkCertPEM(b []byte) error {
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM CERTIFICATE block")
	}
	return nil
}

// current is the certificate served now.
func (p *Pair) current() *tls.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cert
}

// PinnedClient returns a client config that trusts exactly the
// certificate p serves at the handshake, whoever signed it: for a
// process's own clients of its own listener (okso all-in-one's simulated
// devices dialling its device tier), which know the certificate but not
// necessarily the CA that signed it.
func (p *Pair) PinnedClient() *tls.Config {
	return &tls.Config{
		// The chain is not verified against roots: the peer's certificate
		// must be byte for byte the one p serves, checked below.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, p.current().Certificate[0]) {
				return errors.New("tls: the peer's certificate is not this process's own")
			}
			return nil
		},
	}
}
