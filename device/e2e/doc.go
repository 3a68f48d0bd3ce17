// Package e2e holds no code, only tests: the device tier (package tier)
// and the device end (package agent) together, over real WebSockets, with
// an embedded NATS server. It is the one place allowed to import both:
// tier and agent never import each other, not even in their own tests,
// which play the other end by hand through package wire.
//
// Run it with go test ./device/e2e; its benchmark, BenchmarkDeviceRoundTrip,
// is the device hop's share of a call's latency.
package e2e
