package schemas_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/schemas"
)

const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"

func TestParseToolName(t *testing.T) {
	fresh := strings.ToLower(ulid.Make().String())
	// The cap_id that makes sysecho.<node>.<cap_id>.invoke 64 characters long.
	cap64 := strings.Repeat("e", schemas.MaxToolName-len("sysecho."+node+"..invoke"))
	valid := []struct {
		name string
		want schemas.ToolName
	}{
		{"sysecho." + node + ".echo.invoke", schemas.ToolName{"sysecho", node, "echo", "invoke"}},
		{"sys." + fresh + ".metrics.subscribe", schemas.ToolName{"sys", fresh, "metrics", "subscribe"}},
		{"a." + node + ".b.c", schemas.ToolName{"a", node, "b", "c"}},
		{"x_1." + node + ".cap_2.verb_3", schemas.ToolName{"x_1", node, "cap_2", "verb_3"}},
		// Exactly 64 characters.
		{"sysecho." + node + "." + cap64 + ".invoke", schemas.ToolName{"sysecho", node, cap64, "invoke"}},
	}
	for _, tc := range valid {
		got, ok := schemas.ParseToolName(tc.name)
		if !ok || got != tc.want {
			t.Errorf("ParseToolName(%q) = %+v, %v; want %+v", tc.name, got, ok, tc.want)
			continue
		}
		if got.String() != tc.name {
			t.Errorf("String() = %q, want %q", got.String(), tc.name)
		}
	}
	if n := len(valid[4].name); n != schemas.MaxToolName {
		t.Fatalf("boundary case is %d chars, want %d", n, schemas.MaxToolName)
	}

	for _, name := range []string{
		"",
		"sysecho." + node + ".echo",              // 3 segments
		"sysecho." + node + ".echo.invoke.extra", // 5 segments
		"sysecho." + node,                        // 2 segments
		"sysecho",                                // 1 segment
		"SYSECHO." + node + ".echo.invoke",       // upper-case kind
		"sysecho." + strings.ToUpper(node) + ".echo.invoke", // upper-case node id
		"sysecho." + node + ".Echo.invoke",
		"sysecho." + node + ".echo.INVOKE",
		"sysecho." + node + "." + cap64 + "e.invoke",                   // 65 chars
		"sysecho." + node + "." + strings.Repeat("e", 200) + ".invoke", // far too long
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xu.echo.invoke",               // 'u' is not Crockford
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xl.echo.invoke",               // 'l'
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xi.echo.invoke",               // 'i'
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xo.echo.invoke",               // 'o'
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3x.echo.invoke",                // 25 chars
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3xyz.echo.invoke",              // 27 chars
		"sysecho.01hzx9k3m4p7q8r9s0t1v2w3x_.echo.invoke",               // underscore in id
		"sysecho.node.echo.invoke",
		".." + node + ".echo.invoke",
		"." + node + ".echo.invoke",            // empty kind
		"sysecho.." + node + ".invoke",         // empty segment
		"sysecho." + node + "..invoke",         // empty cap
		"sysecho." + node + ".echo.",           // empty verb
		"sysecho." + node + ".echo.invoke.",    // trailing dot
		".sysecho." + node + ".echo.invoke",    // leading dot
		"sysecho." + node + ".echo.invoke\n",   // trailing newline
		" sysecho." + node + ".echo.invoke",    // leading space
		"sysecho." + node + ".ec-ho.invoke",    // dash
		"sysecho." + node + ".echo.inv*ke",     // NATS wildcard
		"sysecho." + node + ".echo.>",          // NATS wildcard
		"sysecho." + node + ".echo.invoké",     // non-ASCII
		"sysecho\x00." + node + ".echo.invoke", // NUL
	} {
		if got, ok := schemas.ParseToolName(name); ok {
			t.Errorf("ParseToolName(%q) accepted: %+v", name, got)
		}
	}
}

func TestValidNodeIDAndTenant(t *testing.T) {
	for s, want := range map[string]bool{
		node:                                  true,
		strings.ToLower(ulid.Make().String()): true,
		strings.ToUpper(node):                 false,
		"":                                    false,
		node[:25]:                             false,
		node + "0":                            false,
		"01hzx9k3m4p7q8r9s0t1v2w3xu":          false,
	} {
		if got := schemas.ValidNodeID(s); got != want {
			t.Errorf("ValidNodeID(%q) = %v, want %v", s, got, want)
		}
	}
	for s, want := range map[string]bool{
		"acme":                  true,
		"A-b_9":                 true,
		strings.Repeat("a", 64): true,
		strings.Repeat("a", 65): false,
		"":                      false,
		"a.b":                   false,
		"*":                     false,
		">":                     false,
		"a b":                   false,
	} {
		if got := schemas.ValidTenant(s); got != want {
			t.Errorf("ValidTenant(%q) = %v, want %v", s, got, want)
		}
	}
}

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
		tn, ok := schemas.ParseToolName(s)
		want := len(s) <= schemas.MaxToolName && toolRe.MatchString(s) && nodeIDRe.MatchString(strings.Split(s, ".")[1])
		if ok != want {
			t.Fatalf("ParseToolName(%q) ok=%v, the regexes say %v", s, ok, want)
		}
		if seg := strings.Split(s+".", ".")[0]; schemas.ValidNodeID(seg) != nodeIDRe.MatchString(seg) {
			t.Fatalf("ValidNodeID(%q) = %v, the regex says otherwise", seg, schemas.ValidNodeID(seg))
		}
		if !ok {
			if tn != (schemas.ToolName{}) {
				t.Fatalf("rejected %q but returned %+v", s, tn)
			}
			return
		}
		if tn.String() != s {
			t.Fatalf("ParseToolName(%q).String() = %q", s, tn.String())
		}
		if len(s) > schemas.MaxToolName {
			t.Fatalf("accepted %d chars", len(s))
		}
		if !schemas.ValidNodeID(tn.NodeID) {
			t.Fatalf("accepted node id %q", tn.NodeID)
		}
		for _, p := range []string{tn.KindShort, tn.NodeID, tn.CapID, tn.Verb} {
			if p == "" || strings.Trim(p, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
				t.Fatalf("accepted segment %q in %q", p, s)
			}
		}
		// Its listed name is one every agent host accepts, and names no
		// other device tool: its segments hold no dash.
		safe := schemas.SafeToolName(s)
		if !schemas.ValidListedName(safe) || strings.Join(strings.Split(safe, "-"), ".") != s {
			t.Fatalf("SafeToolName(%q) = %q", s, safe)
		}
	})
}

func TestSafeToolName(t *testing.T) {
	for in, want := range map[string]string{
		"sysecho." + node + ".echo.invoke": "sysecho-" + node + "-echo-invoke",
		"everything.get-sum":               "everything-get-sum",
		"web.v1.search":                    "web-v1-search",
		"okso.find_tools":                  "okso-find_tools",
		"ant_send_note":                    "ant_send_note",
	} {
		if got := schemas.SafeToolName(in); got != want || !schemas.ValidListedName(got) {
			t.Errorf("SafeToolName(%q) = %q, want %q", in, got, want)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", strings.Repeat("a", 65), "é"} {
		if schemas.ValidListedName(bad) {
			t.Errorf("ValidListedName(%q) = true", bad)
		}
	}
}

// FuzzValidTenant: the hand check is the regexp it replaced.
func FuzzValidTenant(f *testing.F) {
	re := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	for _, s := range []string{"demo", "", "a b", "a.b", "A-Z_09", strings.Repeat("x", 64), strings.Repeat("x", 65), "é", "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := schemas.ValidTenant(s), re.MatchString(s); got != want {
			t.Fatalf("ValidTenant(%q) = %v, the regexp says %v", s, got, want)
		}
	})
}

// BenchmarkParseToolName: the gateway parses every called name.
func BenchmarkParseToolName(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := schemas.ParseToolName("sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke"); !ok {
			b.Fatal("not parsed")
		}
	}
}
