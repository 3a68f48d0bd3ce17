package bus

import (
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Role is whom a NATS connection acts for. Each role has a credential of
// its own and may publish and subscribe only what its part of okso needs
// (DESIGN.md §6): a stolen gateway credential cannot serve a node's
// calls or write the registry, a device tier's cannot call a device as
// a gateway would, and no role's can delete a revocation.
type Role string

// okso's roles on NATS.
const (
	RoleGateway Role = "gateway" // okso gateway: calls nodes, upstreams and callers
	RoleDevice  Role = "device"  // okso device: serves nodes' calls, writes the registry
	RoleRemote  Role = "remote"  // okso remote: serves federated upstreams' calls
	// RoleAudit reads the audit events (okso.v1.audit.> and the stream
	// okso_audit) and nothing else: an operator's audit pipeline.
	RoleAudit Role = "audit"
	// RoleAdmin may do anything: okso token revoke (the only writer of
	// okso_revoked) and an operator's own tools.
	RoleAdmin Role = "admin"
)

// Roles are every role, in the order okso lists them.
var Roles = []Role{RoleGateway, RoleDevice, RoleRemote, RoleAudit, RoleAdmin}

// ParseRole returns the role named s.
func ParseRole(s string) (Role, bool) {
	for _, r := range Roles {
		if string(r) == s {
			return r, true
		}
	}
	return "", false
}

// InboxPrefix is the prefix of the reply subjects of r's connections: a
// role may subscribe only to its own, so no other role reads the answers
// to its requests. The admin's, and no role's, are NATS's default ("").
func (r Role) InboxPrefix() string {
	if r == RoleAdmin || r == "" {
		return ""
	}
	return "_INBOX." + string(r)
}

// ResponseTTL bounds how long a role may answer a request it received
// (each request is answered once): longer than any budget okso gives a
// call (--fleet-budget and --caller-timeout included), so that a late
// answer is dropped by its caller, never refused by NATS.
const ResponseTTL = 10 * time.Minute

// Permissions returns what r may publish and subscribe to; nil for the
// admin, who may do anything. Every role may also answer, once, each
// request it received (on that request's reply subject).
func (r Role) Permissions() *server.Permissions {
	var pub, sub []string
	switch r {
	case RoleGateway:
		pub = []string{
			NodeCmd("*"), NodeCancel("*"), RemoteCall("*"),
			subjectPrefix + "caller.>", subjectPrefix + "call.>", Audit("*"),
		}
		pub = append(pub, kvAccess(BucketNodes, false)...)
		pub = append(pub, kvAccess(BucketRemotes, false)...)
		pub = append(pub, kvAccess(BucketCallers, true)...)
		pub = append(pub, kvAccess(BucketRevoked, false)...)
		pub = append(pub, streamAdmin(StreamAudit)...)
		sub = []string{Stream("*"), subjectPrefix + "caller.>", subjectPrefix + "call.>"}
	case RoleDevice:
		// NodeCancel: a session that takes a node over says so to the
		// node's older session, on any tier.
		pub = []string{NodeCancel("*"), Stream("*"), Audit("*")}
		pub = append(pub, kvAccess(BucketNodes, true)...)
		pub = append(pub, kvAccess(BucketNodeTenants, true)...)
		pub = append(pub, kvAccess(BucketRevoked, false)...)
		sub = []string{NodeCmd("*"), NodeCancel("*")}
	case RoleRemote:
		// RemoteCall: a replica asks whether another still serves an
		// upstream. It holds every upstream's connection itself, so it
		// gains nothing by calling one through NATS.
		pub = []string{RemoteCall("*"), Audit("*")}
		pub = append(pub, kvAccess(BucketRemotes, true)...)
		sub = []string{RemoteCall("*")}
	case RoleAudit:
		pub = append(streamRead(StreamAudit), "$JS.ACK."+StreamAudit+".>")
		sub = []string{subjectPrefix + "audit.>"}
	default:
		return nil
	}
	pub = append(pub, jsAPI+"INFO")
	sub = append(sub, r.InboxPrefix()+".>")
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: sub},
		Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: ResponseTTL},
	}
}

const jsAPI = "$JS.API."

// streamRead is what reading a stream takes: what it is, its messages,
// consumers of one's own.
func streamRead(stream string) []string {
	return []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "STREAM.MSG.GET." + stream,
		jsAPI + "DIRECT.GET." + stream + ".>",
		jsAPI + "CONSUMER.CREATE." + stream,
		jsAPI + "CONSUMER.CREATE." + stream + ".>",
		jsAPI + "CONSUMER.DURABLE.CREATE." + stream + ".>",
		jsAPI + "CONSUMER.INFO." + stream + ".>",
		jsAPI + "CONSUMER.DELETE." + stream + ".>",
		jsAPI + "CONSUMER.MSG.NEXT." + stream + ".>",
	}
}

// kvAccess is what reading a bucket takes (binding to it, creating it if
// it does not exist yet, watching it, getting a key) and, with write,
// writing its keys. Updating, purging or deleting the bucket's stream, or
// deleting one of its messages through the API, is never in it.
func kvAccess(bucket string, write bool) []string {
	stream := kvStream(bucket)
	s := []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "STREAM.CREATE." + stream,
		jsAPI + "STREAM.MSG.GET." + stream,
		jsAPI + "DIRECT.GET." + stream + ".>",
		jsAPI + "CONSUMER.CREATE." + stream,
		jsAPI + "CONSUMER.CREATE." + stream + ".>",
		jsAPI + "CONSUMER.INFO." + stream + ".>",
		jsAPI + "CONSUMER.DELETE." + stream + ".>",
	}
	if write {
		s = append(s, "$KV."+bucket+".>")
	}
	return s
}

// streamAdmin is what keeping a stream of one's own takes: creating and
// updating it, and reading what it is.
func streamAdmin(stream string) []string {
	return []string{jsAPI + "STREAM.INFO." + stream, jsAPI + "STREAM.CREATE." + stream, jsAPI + "STREAM.UPDATE." + stream}
}
