// Package bus is okso's NATS layer: the embedded server, the subject names,
// the message shapes that cross between the gateway and the device tier, the
// node registry (JetStream KV) and the closed error envelope.
//
// The gateway and the device tier never share memory; they meet only here.
// Start an embedded server with [StartServer], connect with [Connect] (or
// [ConnectURL] for an external cluster), then open the registry with
// [OpenRegistry].
package bus

import (
	"strings"
)

// Subjects (DESIGN.md §4).
const (
	subjectPrefix = "okso.v1."
	// QueueNode is the queue group of the per-node cmd subject, so that two
	// sessions of one node briefly alive never both answer one request.
	QueueNode = "okso.node"
)

// NodeCmd is the request/reply subject of one node.
func NodeCmd(nodeID string) string { return subjectPrefix + "node." + nodeID + ".cmd" }

// NodeCancel is the subject that stops a stream or an in-flight call.
func NodeCancel(nodeID string) string { return subjectPrefix + "node." + nodeID + ".cancel" }

// NodeOfSubject returns the node id of a node's cmd or cancel subject.
func NodeOfSubject(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, subjectPrefix+"node.")
	if !ok {
		return "", false
	}
	i := strings.IndexByte(rest, '.')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

// Stream is the subject that carries the frames of one subscription.
func Stream(streamID string) string { return subjectPrefix + "stream." + streamID }

// CallCancel is the subject on which any gateway replica relays an MCP
// client's notifications/cancelled to the replica serving that request.
// key names the request and its caller (the gateway derives it from the
// caller's token and the JSON-RPC id), so one client cannot name
// another's request.
func CallCancel(key string) string { return subjectPrefix + "call." + key + ".cancel" }

// Audit is the subject of a tenant's audit events.
func Audit(tenant string) string { return subjectPrefix + "audit." + tenant }

// Headers carried by a call request.
const (
	HeaderRequestID   = "Okso-Request-Id"
	HeaderTraceparent = "traceparent"
	HeaderBudgetMs    = "Okso-Budget-Ms" // remaining caller budget, decimal milliseconds
	// HeaderDeadline is when the caller's budget ends, as Unix time in
	// decimal milliseconds of the sender's clock: a request that arrives
	// after it (held in a reconnect buffer, say) must not start, whatever
	// budget it still claims.
	HeaderDeadline = "Okso-Deadline"
	HeaderTenant   = "Okso-Tenant"
	HeaderSubject  = "Okso-Subject"
)

// validToken reports whether s is 1 to 64 of [A-Za-z0-9_-]: a subject
// token okso makes of a tenant or a token id. Checked for every audit
// event, so by hand rather than by regexp.
func validToken(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// MaxToolName is the longest projected tool name (seed 000 §2).
const MaxToolName = 64

// ValidNodeID reports whether s is a lower-case ULID, the form of a node
// id: 26 characters of Crockford's base 32 (no i, l, o, u). Names are
// checked several times per call, so by hand rather than by regexp.
func ValidNodeID(s string) bool {
	if len(s) != 26 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' && c != 'i' && c != 'l' && c != 'o' && c != 'u') {
			return false
		}
	}
	return true
}

// ValidTenant reports whether s can name a tenant (it becomes a subject token).
func ValidTenant(s string) bool { return validToken(s) }

// ToolName is a parsed projected tool name {kind_short}.{node_id}.{cap_id}.{verb}.
type ToolName struct {
	KindShort, NodeID, CapID, Verb string
}

// String returns the projected form.
func (t ToolName) String() string {
	return t.KindShort + "." + t.NodeID + "." + t.CapID + "." + t.Verb
}

// ParseToolName parses and checks a projected tool name: the DESIGN.md §2
// regex ^[a-z0-9_]+(\.[a-z0-9_]+){3}$, at most 64 characters, and a valid
// node id in the second segment.
func ParseToolName(s string) (ToolName, bool) {
	if len(s) > MaxToolName {
		return ToolName{}, false
	}
	var p [4]string
	n, start := 0, 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return ToolName{}, false
			}
			continue
		}
		if i == start || n == len(p) {
			return ToolName{}, false // an empty segment, or a fifth
		}
		p[n], n, start = s[start:i], n+1, i+1
	}
	if n != len(p) || !ValidNodeID(p[1]) {
		return ToolName{}, false
	}
	return ToolName{KindShort: p[0], NodeID: p[1], CapID: p[2], Verb: p[3]}, true
}
