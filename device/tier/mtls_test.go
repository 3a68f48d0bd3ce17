package tier_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// TestClientCerts: with ClientCerts, a device whose token is for its
// certificate's node is served; one whose token is for another node, or
// that has no certificate, is refused with 4403 before its node id is
// bound, and the refusal is audited as a denial.
func TestClientCerts(t *testing.T) {
	tt := newTestTier(t, tier.Options{ClientCerts: true})
	ca := certtest.NewCA(t)
	node := wire.NewNodeID()
	certFile, keyFile := ca.WriteDevice(t, t.TempDir(), node)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(tt.Tier.Handler())
	srv.TLS = &tls.Config{ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig.Certificates = []tls.Certificate{pair}
	t.Cleanup(tr.CloseIdleConnections)
	url := "wss" + strings.TrimPrefix(srv.URL, "https") + wire.Path
	dialTLS := func() *rawClient {
		return tt.dialURL(t, url, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol},
			HTTPClient: &http.Client{Transport: tr}})
	}

	if ok := dialTLS().authenticate(t, tt.Token(t, node)); ok.NodeID != node {
		t.Fatalf("auth_ok for %s, want %s", ok.NodeID, node)
	}

	refused := func(rc *rawClient, other, why string) {
		t.Helper()
		rc.recv(t, wire.TypeHello, nil)
		rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.Token(t, other)})
		if code, _ := rc.waitClose(t); code != wire.CloseForbidden {
			t.Fatalf("%s: closed with %d, want %d", why, code, wire.CloseForbidden)
		}
		tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionDenied && e.NodeID == other
		})
	}
	refused(dialTLS(), wire.NewNodeID(), "a token for another node than the certificate's")
	refused(tt.dial(t, nil), wire.NewNodeID(), "no certificate")
}
