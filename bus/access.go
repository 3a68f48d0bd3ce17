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
	return "_INBOX." + string(r) // see FromRole, which checks it without building it
}

// ResponseTTL bounds how long a role may answer a request it received:
// longer than any budget okso gives a call. A role answers another's
// request on its reply subject by NATS's answer-once permission alone, so
// that no role may publish into another's reply subjects otherwise
// (their tokens come from a generator that is no secret, and a gateway
// reads a bucket on one of them). NATS forgets what a connection received
// when it reconnects: an answer the answering role gives after that is
// refused, and its requester's call ends with its budget.
const ResponseTTL = 10 * time.Minute

// access accumulates what a role may publish and subscribe to.
type access struct{ pub, sub []string }

// kv adds what the role may do with bucket (see kvAccess).
func (a *access) kv(bucket string, write bool) {
	pub, sub := kvAccess(bucket, write)
	a.pub, a.sub = append(a.pub, pub...), append(a.sub, sub...)
}

// Permissions returns what r may publish and subscribe to; nil for the
// admin, who may do anything.
func (r Role) Permissions() *server.Permissions {
	var a access
	switch r {
	case RoleGateway:
		a.pub = []string{
			NodeCmd("*"), NodeCancel("*"), RemoteCall("*"),
			subjectPrefix + "caller.>", subjectPrefix + "call.>", Audit("*"),
		}
		// Audit("*"): the dashboard's live audit feed, one tenant's
		// subject at a time (mcp/ui.go); never the audit stream's stored
		// events, which only the audit role reads.
		a.sub = []string{Stream("*"), subjectPrefix + "caller.>", subjectPrefix + "call.>", Audit("*")}
		a.kv(BucketNodes, false)
		a.kv(BucketTiers, false) // a node is online while its tier's lease is
		a.kv(BucketRemotes, false)
		a.kv(BucketCallers, true)
		a.kv(BucketPlans, true) // fleet.call's dry runs, for any replica to run
		a.kv(BucketRevoked, false)
		a.kv(BucketKinds, false) // the admin registers kinds (okso kinds apply)
		// okso's authorization server: every record but the operator's
		// decisions, which only the admin writes (okso oauth approve).
		a.kv(BucketOAuth, false)
		for _, kind := range []string{OAuthClient, OAuthRequest, OAuthCode, OAuthRedeemed, OAuthGrant} {
			a.pub = append(a.pub, "$KV."+BucketOAuth+"."+kind+".>")
		}
		// The audit stream (--audit-retention), which the admin makes.
		a.pub = append(a.pub, jsAPI+"STREAM.INFO."+StreamAudit)
	case RoleDevice:
		// NodeCancel: a session that takes a node over says so to the
		// node's older session, on any tier.
		a.pub = []string{NodeCancel("*"), Stream("*"), Audit("*")}
		a.sub = []string{NodeCmd("*"), NodeCancel("*")}
		a.kv(BucketNodes, true)
		// Its own lease, and others' to find the nodes of a tier that died.
		a.kv(BucketTiers, true)
		a.kv(BucketNodeTenants, true)
		a.kv(BucketRevoked, false)
		a.kv(BucketKinds, false)
	case RoleRemote:
		// RemoteCall: a replica asks whether another still serves an
		// upstream. It holds every upstream's connection itself, so it
		// gains nothing by calling one through NATS.
		a.pub = []string{RemoteCall("*"), Audit("*")}
		a.sub = []string{RemoteCall("*")}
		a.kv(BucketRemotes, true)
	case RoleAudit:
		a.pub = streamRead(StreamAudit)
		a.sub = []string{subjectPrefix + "audit.>"}
	default:
		return nil
	}
	a.pub = append(a.pub, jsAPI+"INFO")
	a.sub = append(a.sub, r.InboxPrefix()+".>")
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: a.pub},
		Subscribe: &server.SubjectPermission{Allow: a.sub},
		Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: ResponseTTL},
	}
}

const jsAPI = "$JS.API."

// streamRead is what reading a stream takes: what it is, and its
// messages by direct gets (no consumers: see kvAccess).
func streamRead(stream string) []string {
	return []string{jsAPI + "STREAM.INFO." + stream, jsAPI + "DIRECT.GET." + stream, jsAPI + "DIRECT.GET." + stream + ".>"}
}

// kvAccess is what reading a bucket takes: binding to it, getting its
// keys (direct gets, one or a page), following it (its republished
// messages) and, with write, writing its keys. Not in it: creating,
// changing, purging or deleting the bucket (the admin makes okso's
// buckets, [InitState]), deleting one of its messages through the API,
// or a consumer (one delivers where its creator says).
func kvAccess(bucket string, write bool) (pub, sub []string) {
	stream := kvStream(bucket)
	pub = []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "DIRECT.GET." + stream,
		jsAPI + "DIRECT.GET." + stream + ".>",
	}
	if write {
		pub = append(pub, "$KV."+bucket+".>")
	}
	return pub, []string{stateSubject(bucket, ">")}
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
	// On each call's path: no prefix is built.
	rest, ok := strings.CutPrefix(m.Reply, "_INBOX.")
	if !ok {
		return false
	}
	for _, r := range roles {
		if r.InboxPrefix() != "" {
			if after, ok := strings.CutPrefix(rest, string(r)); ok && len(after) > 1 && after[0] == '.' {
				return true
			}
		}
	}
	return false
}

// FromJetStream reports whether JetStream sent m (a direct get's answer,
// a republished or delivered message), not a client: it carries the
// stream's name (a header JetStream adds after a stored message's own, so
// present whatever those were, empty ones included).
func FromJetStream(m *nats.Msg) bool {
	return len(m.Header.Values(jetstream.StreamHeader)) > 0
}
