package schemas

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Names and labels of nodes (DESIGN.md §3, announce with the feature
// labels): what a fleet is chosen by. The manifest schema states the same
// rules as patterns (TestLabelRulesMatchTheManifest and FuzzLabelRules
// hold the two equal), except the one a pattern cannot say: a key's
// prefix is at most 253 characters.

// Bounds of names and labels.
const (
	MaxNodeName    = 63  // a node name: ^[a-z0-9][a-z0-9.-]{0,62}$
	MaxLabels      = 16  // labels from one source (the device, a token, the tier's file)
	MaxLabelName   = 63  // the name part of a key, and a value
	MaxLabelPrefix = 253 // the optional DNS-subdomain prefix of a key
)

// ValidNodeName reports whether s can name a node:
// ^[a-z0-9][a-z0-9.-]{0,62}$. A name is a label for people and filters,
// not an identity: two nodes may share one.
func ValidNodeName(s string) bool {
	if len(s) == 0 || len(s) > MaxNodeName || !lowerAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !lowerAlnum(c) && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// NodeNameOf maps a host name to a node name: lower-cased, each byte
// outside [a-z0-9.-] made '-', leading bytes that cannot start a name
// dropped, cut to 63; "" when nothing is left.
func NodeNameOf(host string) string {
	b := []byte(strings.ToLower(host))
	for i, c := range b {
		if !lowerAlnum(c) && c != '.' && c != '-' {
			b[i] = '-'
		}
	}
	for len(b) > 0 && !lowerAlnum(b[0]) {
		b = b[1:]
	}
	return string(b[:min(len(b), MaxNodeName)])
}

// CheckLabelKey checks a label key: an optional prefix, a DNS subdomain
// of at most 253 characters (lower-case alphanumeric parts of [a-z0-9-]
// joined by dots, each beginning and ending alphanumeric), and '/', then
// a name of 1 to 63 of [A-Za-z0-9-_.] beginning and ending alphanumeric
// (Kubernetes' rule). The error names the rule broken, never the key.
func CheckLabelKey(k string) error {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name = prefix
	} else {
		if len(prefix) > MaxLabelPrefix {
			return fmt.Errorf("label key prefix longer than %d characters", MaxLabelPrefix)
		}
		if !dnsSubdomain(prefix) {
			return errors.New("label key prefix not a DNS subdomain ([a-z0-9-] parts joined by dots)")
		}
	}
	if name == "" {
		return errors.New("label key without a name")
	}
	if len(name) > MaxLabelName {
		return fmt.Errorf("label key name longer than %d characters", MaxLabelName)
	}
	if !labelText(name) {
		return errors.New("label key name not [A-Za-z0-9-_.] starting and ending alphanumeric")
	}
	return nil
}

// CheckLabelValue checks a label value: empty, or 1 to 63 of
// [A-Za-z0-9-_.] beginning and ending alphanumeric. The error names the
// rule broken, never the value.
func CheckLabelValue(v string) error {
	if len(v) > MaxLabelName {
		return fmt.Errorf("label value longer than %d characters", MaxLabelName)
	}
	if v != "" && !labelText(v) {
		return errors.New("label value not [A-Za-z0-9-_.] starting and ending alphanumeric")
	}
	return nil
}

// CheckLabels checks one source's labels: at most [MaxLabels], each key
// and value by its rule. The error says which rule, and which key by its
// place in sorted order, never the text itself: a device's words do not
// reach a log or an answer unchecked.
func CheckLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("more than %d labels", MaxLabels)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if err := CheckLabelKey(k); err != nil {
			return fmt.Errorf("label %d of %d by key: %w", i+1, len(keys), err)
		}
		if err := CheckLabelValue(labels[k]); err != nil {
			return fmt.Errorf("label %d of %d by key: %w", i+1, len(keys), err)
		}
	}
	return nil
}

// ParseLabel parses k=v, the form of a label on a command line. The
// value may be empty ("k="); the key may not.
func ParseLabel(s string) (k, v string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", fmt.Errorf("label %q: want key=value", s)
	}
	if err := CheckLabelKey(k); err != nil {
		return "", "", fmt.Errorf("label %q: %w", s, err)
	}
	if err := CheckLabelValue(v); err != nil {
		return "", "", fmt.Errorf("label %q: %w", s, err)
	}
	return k, v, nil
}

// MergeLabels returns the labels of a node: base, then each of over in
// turn, a later source's value winning key by key. Nil when there are
// none; the arguments are not modified.
func MergeLabels(base map[string]string, over ...map[string]string) map[string]string {
	var out map[string]string
	for _, m := range append([]map[string]string{base}, over...) {
		for k, v := range m {
			if out == nil {
				out = make(map[string]string, len(m))
			}
			out[k] = v
		}
	}
	return out
}

func lowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func alnum(c byte) bool { return lowerAlnum(c) || c >= 'A' && c <= 'Z' }

// labelText reports whether s is [A-Za-z0-9] alone or [A-Za-z0-9]
// [-A-Za-z0-9_.]* [A-Za-z0-9]; lengths are checked apart.
func labelText(s string) bool {
	if s == "" || !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := 1; i < len(s)-1; i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// dnsSubdomain reports whether s is parts of [a-z0-9-], each beginning
// and ending [a-z0-9], joined by dots (RFC 1123 as Kubernetes reads it;
// its length is checked apart).
func dnsSubdomain(s string) bool {
	if s == "" {
		return false
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" || !lowerAlnum(part[0]) || !lowerAlnum(part[len(part)-1]) {
			return false
		}
		for i := 0; i < len(part); i++ {
			if c := part[i]; !lowerAlnum(c) && c != '-' {
				return false
			}
		}
	}
	return true
}
