package schemas

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The names of federated upstreams and their tools (DESIGN.md §8, §9.1).

// reserved names are okso's own namespaces: no upstream (and no caller
// id) may take one.
var reserved = []string{"fleet", "okso", "caller"}

// IsReserved reports whether name is one of okso's own namespaces.
func IsReserved(name string) bool { return slices.Contains(reserved, name) }

// MaxUpstreamName is the longest upstream name.
const MaxUpstreamName = 16

// ValidUpstream reports whether name can name an upstream:
// ^[a-z][a-z0-9_]{0,15}$, neither reserved nor a kind_short.
func ValidUpstream(name string) bool {
	if len(name) == 0 || len(name) > MaxUpstreamName || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return !IsReserved(name) && !IsKindShort(name)
}

// toolNameByte reports whether c may appear in a tool name: every name
// okso lists is made of [A-Za-z0-9_.-] (DESIGN.md §8).
func toolNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-'
}

// RemoteToolName projects an upstream's tool as {upstream}.{tool}: two
// segments split at the first dot, the tool's name as the upstream wrote
// it (dots included: its listed name maps them, [SafeToolName]). It never
// truncates: a tool whose projected name would break the rules of
// DESIGN.md §8 (at most 64 characters of [A-Za-z0-9_.-]) is refused, and
// the error says why, in words okso wrote (the tool's name is not echoed:
// an upstream wrote it).
func RemoteToolName(upstream, tool string) (string, error) {
	if !ValidUpstream(upstream) {
		return "", errors.New("upstream name is not valid")
	}
	if tool == "" {
		return "", errors.New("tool name is empty")
	}
	for i := 0; i < len(tool); i++ {
		if !toolNameByte(tool[i]) {
			return "", errors.New("tool name has a character outside [A-Za-z0-9_.-]")
		}
	}
	name := upstream + "." + tool
	if len(name) > MaxToolName {
		return "", fmt.Errorf("projected tool name would be %d characters, over %d", len(name), MaxToolName)
	}
	return name, nil
}

// ParseRemoteToolName splits a name [RemoteToolName] made.
func ParseRemoteToolName(name string) (upstream, tool string, ok bool) {
	upstream, tool, found := strings.Cut(name, ".")
	if !found {
		return "", "", false
	}
	if n, err := RemoteToolName(upstream, tool); err != nil || n != name {
		return "", "", false
	}
	return upstream, tool, true
}

// ValidToolSchema checks that raw can be a listed tool's input schema: a
// JSON object whose "type" is "object" (MCP requires it, and the SDK's
// server refuses any other), with no "x-mcp-header" anywhere (a request
// header the SDK would route an argument into, and whose malformed uses
// make its server panic: okso federates no such tool).
func ValidToolSchema(raw json.RawMessage) error {
	v, err := Decode(raw)
	m, ok := v.(map[string]any)
	if err != nil || !ok {
		return errors.New("input schema is not one JSON object")
	}
	if m["type"] != "object" {
		return errors.New(`input schema's type is not "object"`)
	}
	if hasKey(v, "x-mcp-header") {
		return errors.New("input schema routes an argument into a request header (x-mcp-header)")
	}
	return nil
}

// hasKey reports whether key is a member name anywhere in v.
func hasKey(v any, key string) bool {
	switch v := v.(type) {
	case map[string]any:
		for k, m := range v {
			if k == key || hasKey(m, key) {
				return true
			}
		}
	case []any:
		for _, e := range v {
			if hasKey(e, key) {
				return true
			}
		}
	}
	return false
}

// MaxDescription bounds the description of a tool okso did not write.
const MaxDescription = 4096

// TrimDescription bounds an upstream's description of a tool to
// MaxDescription bytes, cut at a character's start.
func TrimDescription(s string) string {
	if len(s) <= MaxDescription {
		return s
	}
	cut := MaxDescription
	for cut > 0 && s[cut]&0xC0 == 0x80 { // not inside a UTF-8 sequence
		cut--
	}
	return s[:cut] + "…"
}
