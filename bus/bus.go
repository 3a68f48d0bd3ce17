// Package bus is okso's NATS layer: the embedded server, the subject names,
// the message shapes that cross between the gateway and the tiers, the node
// registry and node bindings (JetStream KV), revocations and the audit. What
// those messages mean (names, codes, schemas) is package schemas'.
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
