package bus

import (
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// ResponseTTL bounds how long a role may answer a message it received
// with a reply subject it may not publish to otherwise (JetStream's flow
// control). Its answers to other roles' requests go to their reply
// subjects ([answers]), which it may publish to whenever: an answer
// given after a reconnect (NATS forgets what a connection received) or
// late is dropped by its requester, never refused by NATS.
const ResponseTTL = 10 * time.Minute

// answers is what answering requests of roles takes: publishing to
// their reply subjects. Those subjects end in a random token of each
// request, which the answering role sees only in the requests it gets.
func answers(roles ...Role) []string {
	var s []string
	for _, r := range roles {
		s = append(s, r.InboxPrefix()+".>")
	}
	return s
}

// Permissions returns what r may publish and subscribe to; nil for the
// admin, who may do anything.
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
		// The audit stream (--audit-retention): made if missing, never
		// changed, so that no gateway can make it keep anything but the
		// audit.
		pub = append(pub, jsAPI+"STREAM.INFO."+StreamAudit, jsAPI+"STREAM.CREATE."+StreamAudit)
		pub = append(pub, answers(RoleGateway)...) // a listen's holder answers the other replicas
		sub = []string{Stream("*"), subjectPrefix + "caller.>", subjectPrefix + "call.>"}
	case RoleDevice:
		// NodeCancel: a session that takes a node over says so to the
		// node's older session, on any tier.
		pub = []string{NodeCancel("*"), Stream("*"), Audit("*")}
		pub = append(pub, answers(RoleGateway)...)
		pub = append(pub, kvAccess(BucketNodes, true)...)
		pub = append(pub, kvAccess(BucketNodeTenants, true)...)
		pub = append(pub, kvAccess(BucketRevoked, false)...)
		sub = []string{NodeCmd("*"), NodeCancel("*")}
	case RoleRemote:
		// RemoteCall: a replica asks whether another still serves an
		// upstream. It holds every upstream's connection itself, so it
		// gains nothing by calling one through NATS.
		pub = []string{RemoteCall("*"), Audit("*")}
		pub = append(pub, answers(RoleGateway, RoleRemote)...)
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

// JetStream publishes to a subject of a client's choosing: a consumer's
// deliveries go to its deliver subject, a direct get's answer (the
// stored message, headers and all) and any API answer to the request's
// reply subject, with no check of the client's permission to publish
// there. A client whose credential may not publish to a subject can thus
// have JetStream publish to it. What okso's roles serve is safe from
// that: a request must come from the role that may send it (its reply
// subject is one of that role's, [FromRole]), and a message JetStream
// sent carries its stream's name ([FromJetStream]).

// FromRole reports whether m, a request, came from one of roles: its
// reply subject is one of theirs ([Role.InboxPrefix]). A message
// JetStream sent has no such reply subject.
func FromRole(m *nats.Msg, roles ...Role) bool {
	for _, r := range roles {
		if p := r.InboxPrefix(); p != "" && strings.HasPrefix(m.Reply, p) && len(m.Reply) > len(p) && m.Reply[len(p)] == '.' {
			return true
		}
	}
	return false
}

// FromJetStream reports whether JetStream sent m (a direct get's answer,
// a republished or delivered message), not a client: it carries the
// stream's name.
func FromJetStream(m *nats.Msg) bool {
	return m.Header != nil && m.Header.Get(jetstream.StreamHeader) != ""
}
