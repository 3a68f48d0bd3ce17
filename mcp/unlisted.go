package mcp

import (
	"context"
	"log/slog"
)

// No tool leaves the catalog silently: every path that takes a source's
// tools out (a record removed or expired, a record or a tool refused, a
// listen replaced) says so once, with the source and the reason, and is
// counted by both. What points at trouble (a lease that lapsed, a record
// or a schema refused, a record that vanished unseen) is a warning; what
// its owner did on purpose (an upstream's remote tier released it, a
// listen ended or was replaced, an upstream listed fewer tools) is info;
// a device that disconnected is debug, a line per device being too many
// for a fleet. The log's repeats bound (--log-repeats) keeps a flood of
// one reason to one line per period.

// Sources of tools, as unlisting names them.
const (
	sourceNameDevice   = "device"
	sourceNameUpstream = "upstream"
	sourceNameCaller   = "caller"
	sourceNameOkso     = "okso" // okso's own tools
)

// Reasons a source's tools leave the catalog.
const (
	reasonRemoved     = "removed by its owner"          // a tier, remote tier or listen removed its record
	reasonDisconnect  = "disconnected"                  // a device's session ended
	reasonLapsed      = "its lease lapsed"              // no one refreshed its record: its owner died or lost NATS
	reasonVanished    = "gone from the registry"        // found gone when the watch read the bucket again
	reasonRefused     = "its record was refused"        // a record okso cannot list
	reasonToolRefused = "a tool was refused"            // one tool of a record (its name, schema, class)
	reasonReplaced    = "replaced by a newer listen"    // a later declaration of the same caller id
	reasonDropped     = "no longer listed by its owner" // a record that lists fewer tools than before
)

// unlistLevel is the level each reason is logged at.
func unlistLevel(reason string) slog.Level {
	switch reason {
	case reasonLapsed, reasonVanished, reasonRefused, reasonToolRefused:
		return slog.LevelWarn
	case reasonDisconnect:
		return slog.LevelDebug
	}
	return slog.LevelInfo
}

// unlisted says that a source's tools (or one tool) left the catalog,
// and why, and counts it; attrs name what left.
func (s *shelf) unlisted(source, reason string, attrs ...any) {
	// Said before counted: whoever sees the count finds the line written.
	s.log.Log(context.Background(), unlistLevel(reason), source+" tools unlisted: "+reason, attrs...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unlistings == nil {
		s.unlistings = map[string]int64{}
	}
	s.unlistings[source+"/"+reason]++
	s.wake() // Wait sees the count
}

// Unlisted is how many times tools left the catalog, by "source/reason"
// (for the metrics).
func (v CatalogView) Unlisted() map[string]int64 {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	out := make(map[string]int64, len(v.s.unlistings))
	for k, n := range v.s.unlistings {
		out[k] = n
	}
	return out
}

// goneReason is why a record left its bucket, as its watch saw it.
func goneReason(expired, invalid bool) string {
	switch {
	case invalid:
		return reasonRefused
	case expired:
		return reasonLapsed
	}
	return reasonRemoved
}
