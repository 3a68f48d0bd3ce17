// Package remote is the remote tier, okso remote: it federates other MCP
// servers and seed-002 action endpoints (DESIGN.md §9.1). For each
// upstream in its config it connects (a child process over stdio, MCP
// Streamable HTTP, or one process per request for an action endpoint),
// lists the tools, keeps those the config allows with the safety classes
// the config gives them in KV okso_remotes under a lease, and serves calls
// on okso.v1.remote.<upstream>.call in queue group remote, so replicas
// share the load. Gateways see those tools as {upstream}.{tool} and call
// them over NATS; a gateway never opens a connection to an upstream.
//
// Start with the config: [Load] reads the YAML file the operator wrote
// (okso remote --config FILE, all-in-one --remotes FILE), checks it
// against the schema remotes.config@1.0.0 and what the schema cannot say,
// and returns each [Upstream] with its defaults filled in. Every error is
// a start-up error naming the file, the line and the field (a few YAML
// syntax errors come without a line from the YAML library). Deny by
// default: [Upstream.Allowed] admits only the tools the config names, and
// [Upstream.SafetyOf] gives each of them the class the config gives it,
// never the upstream's own hints.
//
// The tier meets the gateway only on NATS (package bus): it imports
// neither package mcp nor the device packages.
package remote
