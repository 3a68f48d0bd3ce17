package schemas

// Names okso's contracts use (DESIGN.md §2, §4): node ids, tenants and
// the projected name of a device tool.

// ValidToken reports whether s is 1 to 64 of [A-Za-z0-9_-]: a NATS
// subject token okso makes of a tenant or a token id. Checked for every
// audit event, so by hand rather than by regexp.
func ValidToken(s string) bool {
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

// SafeToolName is the listed form of a canonical tool name: each '.'
// becomes '-' (DESIGN.md §8), so that agent hosts which accept only
// ^[A-Za-z0-9_-]{1,64}$ take it. No segment of a canonical name okso
// projects has a '-', so the mapping is exact for devices, okso's own tools
// and upstreams' undotted tools; where it is not (an upstream's tools
// "a.b" and "a-b"), the catalog refuses the second. A safe name is never
// parsed back: the catalog records each entry's.
func SafeToolName(name string) string {
	b := []byte(name)
	for i, c := range b {
		if c == '.' {
			b[i] = '-'
		}
	}
	return string(b)
}

// ValidListedName reports whether s is a name every agent host accepts:
// ^[A-Za-z0-9_-]{1,64}$.
func ValidListedName(s string) bool { return ValidToken(s) }

// ValidNodeID reports whether s is a node id: a lower-case ULID.
func ValidNodeID(s string) bool { return ValidID(s) }

// ValidID reports whether s is a lower-case ULID, the form of the ids okso
// makes (node ids, stream ids): 26 characters of Crockford's base 32 (no
// i, l, o, u). Checked several times per call, so by hand rather than by
// regexp.
func ValidID(s string) bool {
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
func ValidTenant(s string) bool { return ValidToken(s) }

// ToolName is a parsed device tool name, projected from a node's manifest
// as {kind_short}.{node_id}.{cap_id}.{verb}.
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
