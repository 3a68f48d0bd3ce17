package roles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/spf13/pflag"

	"github.com/okso-io/okso/internal/certfile"
)

// tlsFiles are --tls-cert and --tls-key: the certificate a listener
// serves, reloaded when the files change.
type tlsFiles struct {
	Cert, Key string
}

func addTLSFlags(fs *pflag.FlagSet, f *tlsFiles, what string) {
	fs.StringVar(&f.Cert, "tls-cert", "", "serve "+what+" over TLS with this PEM certificate (chain), reloaded when it changes; with --tls-key")
	fs.StringVar(&f.Key, "tls-key", "", "PEM private key of --tls-cert")
}

// load loads the pair, or returns nil when neither flag is set.
func (f tlsFiles) load(log *slog.Logger) (*certfile.Pair, error) {
	switch {
	case f.Cert == "" && f.Key == "":
		return nil, nil
	case f.Key == "":
		return nil, errors.New("--tls-cert needs --tls-key")
	case f.Cert == "":
		return nil, errors.New("--tls-key needs --tls-cert")
	}
	return certfile.Load(f.Cert, f.Key, log)
}

// serveTLS makes p serve TLS with pair, offering protos by ALPN.
func (p *httpPart) serveTLS(pair *certfile.Pair, protos ...string) {
	p.pair = pair
	p.ln = tls.NewListener(p.ln, &tls.Config{
		GetCertificate: pair.GetCertificate,
		NextProtos:     protos,
		MinVersion:     tls.VersionTLS12,
	})
}

// warnPlain logs, once at start, that p serves what in plain text on an
// address other hosts can reach.
func (p *httpPart) warnPlain(log *slog.Logger, what string) {
	if p.pair != nil {
		return
	}
	if a, ok := p.ln.Addr().(*net.TCPAddr); ok && a.IP.IsLoopback() {
		return
	}
	log.Warn("listening without TLS on an address other hosts can reach: "+what+" cross the network in plain text "+
		"(give --tls-cert and --tls-key)", "addr", p.addr())
}

// clientTLS is the TLS config of devices that dial wss:// URLs: the
// system's roots and the PEM bundle caFile, if set.
func clientTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // no system roots here: the bundle's alone
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--ca %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
