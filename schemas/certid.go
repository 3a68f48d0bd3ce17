package schemas

import (
	"crypto/x509"
	"strings"
)

// NodeURIPrefix begins the URI SAN that names a device certificate's
// node: okso:node:<node_id>.
const NodeURIPrefix = "okso:node:"

// CertNodeID is the node id a device certificate is for (DESIGN.md §6,
// device mTLS): its URI SAN okso:node:<node_id> or, when it has none, its
// subject's common name. A certificate with several okso:node URIs, or
// whose name is no node id (a wildcard, a host name), is for no node: "".
func CertNodeID(cert *x509.Certificate) string {
	id, n := "", 0
	for _, u := range cert.URIs {
		if s := u.String(); strings.HasPrefix(s, NodeURIPrefix) {
			id, n = strings.TrimPrefix(s, NodeURIPrefix), n+1
		}
	}
	switch {
	case n > 1:
		return ""
	case n == 0:
		id = cert.Subject.CommonName
	}
	if !ValidNodeID(id) {
		return ""
	}
	return id
}
