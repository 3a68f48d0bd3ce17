package bus_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/okso-io/okso/bus"
)

// FuzzParseToolName must never panic, and a name it accepts must round-trip
// through String and be safe to put in a NATS subject.
func FuzzParseToolName(f *testing.F) {
	for _, s := range []string{
		"sysecho." + node + ".echo.invoke",
		"sys." + node + ".metrics.subscribe",
		"sysecho." + node + ".echo",
		"sysecho." + node + ".echo.invoke.x",
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xu.echo.invoke",
		"SYSECHO." + node + ".echo.invoke",
		"sysecho.." + node + ".invoke",
		"sysecho." + node + ".echo.>",
		"",
		strings.Repeat("a.", 40),
	} {
		f.Add(s)
	}
	// The DESIGN.md §2 regexes, as the reference for the hand-written checks.
	toolRe := regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_]+){3}$`)
	nodeIDRe := regexp.MustCompile(`^[0-9a-hjkmnp-tv-z]{26}$`)
	f.Fuzz(func(t *testing.T, s string) {
		tn, ok := bus.ParseToolName(s)
		want := len(s) <= bus.MaxToolName && toolRe.MatchString(s) && nodeIDRe.MatchString(strings.Split(s, ".")[1])
		if ok != want {
			t.Fatalf("ParseToolName(%q) ok=%v, the regexes say %v", s, ok, want)
		}
		if seg := strings.Split(s+".", ".")[0]; bus.ValidNodeID(seg) != nodeIDRe.MatchString(seg) {
			t.Fatalf("ValidNodeID(%q) = %v, the regex says otherwise", seg, bus.ValidNodeID(seg))
		}
		if !ok {
			if tn != (bus.ToolName{}) {
				t.Fatalf("rejected %q but returned %+v", s, tn)
			}
			return
		}
		if tn.String() != s {
			t.Fatalf("ParseToolName(%q).String() = %q", s, tn.String())
		}
		if len(s) > bus.MaxToolName {
			t.Fatalf("accepted %d chars", len(s))
		}
		if !bus.ValidNodeID(tn.NodeID) {
			t.Fatalf("accepted node id %q", tn.NodeID)
		}
		for _, p := range []string{tn.KindShort, tn.NodeID, tn.CapID, tn.Verb} {
			if p == "" || strings.Trim(p, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
				t.Fatalf("accepted segment %q in %q", p, s)
			}
		}
		if subj := bus.NodeCmd(tn.NodeID); strings.ContainsAny(subj, "*> \t\r\n") || strings.Count(subj, ".") != 4 {
			t.Fatalf("node id %q makes subject %q", tn.NodeID, subj)
		}
	})
}
