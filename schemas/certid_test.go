package schemas_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"testing"

	"github.com/okso-io/okso/schemas"
)

func TestCertNodeID(t *testing.T) {
	const a, b = "01hzy3v7q8k2m4n6p8r0s2t4v6", "01hzy3v7q8k2m4n6p8r0s2t4v7"
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	for _, c := range []struct {
		name string
		cert x509.Certificate
		want string
	}{
		{"uri", x509.Certificate{URIs: []*url.URL{uri("okso:node:" + a)}}, a},
		{"uri over cn", x509.Certificate{URIs: []*url.URL{uri("okso:node:" + a)}, Subject: pkix.Name{CommonName: b}}, a},
		{"cn", x509.Certificate{Subject: pkix.Name{CommonName: b}}, b},
		{"cn with another uri", x509.Certificate{URIs: []*url.URL{uri("spiffe://x/y")}, Subject: pkix.Name{CommonName: b}}, b},
		{"two nodes", x509.Certificate{URIs: []*url.URL{uri("okso:node:" + a), uri("okso:node:" + b)}}, ""},
		{"wildcard uri", x509.Certificate{URIs: []*url.URL{uri("okso:node:*")}, Subject: pkix.Name{CommonName: b}}, ""},
		{"wildcard cn", x509.Certificate{Subject: pkix.Name{CommonName: "*"}}, ""},
		{"host name", x509.Certificate{Subject: pkix.Name{CommonName: "device.example.com"}}, ""},
		{"upper case", x509.Certificate{Subject: pkix.Name{CommonName: "01HZY3V7Q8K2M4N6P8R0S2T4V6"}}, ""},
		{"none", x509.Certificate{}, ""},
	} {
		if got := schemas.CertNodeID(&c.cert); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
