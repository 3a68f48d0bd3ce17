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
	"github.com/okso-io/okso/schemas"
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

// load loads the pair, or returns nil when neither flag is set; flag is
// the flags' prefix in errors ("--tls", "--nats-tls").
func (f tlsFiles) load(log *slog.Logger, flag string) (*certfile.Pair, error) {
	switch {
	case f.Cert == "" && f.Key == "":
		return nil, nil
	case f.Key == "":
		return nil, fmt.Errorf("%s-cert needs %s-key", flag, flag)
	case f.Cert == "":
		return nil, fmt.Errorf("%s-key needs %s-cert", flag, flag)
	}
	p, err := certfile.Load(f.Cert, f.Key, log)
	if err != nil && flag != "--tls" {
		return nil, fmt.Errorf("%s-cert: %w", flag, err)
	}
	return p, err
}

// serveTLS makes p serve TLS with pair, offering protos by ALPN. With
// clientCAs, a client must present a certificate they sign (mTLS), or
// the handshake fails; the bundle's file is followed like the pair's.
func (p *httpPart) serveTLS(pair *certfile.Pair, clientCAs *certfile.Bundle, protos ...string) {
	p.pair = pair
	conf := &tls.Config{
		GetCertificate: pair.GetCertificate,
		NextProtos:     protos,
		MinVersion:     tls.VersionTLS12,
	}
	if clientCAs != nil {
		conf = &tls.Config{GetConfigForClient: clientCAs.ServerConfig(conf), MinVersion: tls.VersionTLS12}
	}
	p.ln = tls.NewListener(p.ln, conf)
}

const clientCAUsage = "device mTLS: PEM bundle of the CAs that sign devices' client certificates (reloaded when it changes; needs --tls-cert). " +
	"A device must present one, whose identity, its URI SAN okso:node:<node_id> or else its CN, is its token's node id (4403 otherwise)"

// ownDevicesMTLS says why a process's own devices cannot dial its tier
// under device mTLS: they hold no certificate its --client-ca signs.
const ownDevicesMTLS = "--client-ca: this process's own devices have no client certificate, so it runs none"

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

// clientFiles are a device's --ca, --client-cert and --client-key.
type clientFiles struct {
	CA string
	// Cert and Key are the client certificate presented when a tier asks
	// for one (device mTLS), reloaded when the files change.
	Cert, Key string
}

const (
	caUsage         = "PEM bundle of CA certificates trusted for wss:// URLs, besides the system's roots"
	clientCertUsage = "PEM client certificate presented to a device tier that asks for one (mTLS), reloaded when it changes; with --client-key"
	clientKeyUsage  = "PEM private key of --client-cert"
)

func addClientFlags(fs *pflag.FlagSet, f *clientFiles) {
	fs.StringVar(&f.CA, "ca", "", caUsage)
	fs.StringVar(&f.Cert, "client-cert", "", clientCertUsage)
	fs.StringVar(&f.Key, "client-key", "", clientKeyUsage)
}

// loadPair loads the client certificate, or returns nil when neither
// flag is set.
func (f clientFiles) loadPair(log *slog.Logger) (*certfile.Pair, error) {
	switch {
	case f.Cert == "" && f.Key == "":
		return nil, nil
	case f.Key == "":
		return nil, errors.New("--client-cert needs --client-key")
	case f.Cert == "":
		return nil, errors.New("--client-key needs --client-cert")
	}
	p, err := certfile.Load(f.Cert, f.Key, log)
	if err != nil {
		return nil, fmt.Errorf("--client-cert: %w", err)
	}
	return p, nil
}

// clientTLS is the TLS config of devices that dial wss:// URLs: the
// system's roots and the PEM bundle f.CA, if set, and the client
// certificate pair, if not nil (nil: the defaults).
func (f clientFiles) clientTLS(pair *certfile.Pair) (*tls.Config, error) {
	if f.CA == "" && pair == nil {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if pair != nil {
		conf.GetClientCertificate = pair.GetClientCertificate
	}
	if f.CA == "" {
		return conf, nil
	}
	var err error
	if conf.RootCAs, err = caPool("--ca", f.CA); err != nil {
		return nil, err
	}
	return conf, nil
}

// caPool is the system's roots and the CAs of the PEM bundle file, given
// with flag.
func caPool(flag, file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // no system roots here: the bundle's alone
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flag, file)
	}
	return pool, nil
}

// certNode is the node id of the client certificate pair, loaded from
// file: a start-up error when it names none.
func certNode(pair *certfile.Pair, file string) (string, error) {
	cert, err := pair.GetClientCertificate(nil)
	if err != nil {
		return "", err
	}
	id := schemas.CertNodeID(cert.Leaf)
	if id == "" {
		return "", fmt.Errorf("--client-cert %s: names no node (want a URI SAN %s<node_id>, or a node id as its CN)", file, schemas.NodeURIPrefix)
	}
	return id, nil
}
