package schemas

import (
	"encoding/json"
	"fmt"
	"strings"
)

// A tool's inputSchema and outputSchema reach clients that resolve no
// reference into okso's set: a client that checks a result against an
// outputSchema whose $ref names mcp://schemas/error@1.0.0 fails to
// compile it. So a tool carries the standalone form of its schema: every
// $ref replaced by what it refers to, in place (beside annotations only)
// or under allOf (beside other keywords, which is what a $ref with
// siblings means in draft 2020-12: unevaluatedProperties sees through
// it). Its $comments, notes for the schema's authors, are left out: an
// agent reads every word of a tool's schema. The set's files, served at
// /schemas/, keep their references and comments. A tool input schema has
// no $ref at all (agent hosts' rule, TestHostSafe), so its standalone form
// only drops the comments; the output schemas still refer ($defs,
// error@1.0.0, fleet.selector's kind) and need the inlining.

// maxInline bounds the references followed one inside another: the
// embedded set has no recursive schema, and one would be refused here.
const maxInline = 32

// Standalone returns the schema with the given $id with every reference
// inlined, as compact JSON: the document to give as a tool's inputSchema
// or outputSchema. The returned slice must not be modified.
func (s *Set) Standalone(id string) (json.RawMessage, bool) {
	b, ok := s.standalone[id]
	return b, ok
}

// inliner inlines the references of the embedded documents, by $id.
type inliner struct{ docs map[string]any }

// standalone returns the document id with its references inlined.
func (in inliner) standalone(id string) (json.RawMessage, error) {
	v, err := in.schema(in.docs[id], id, 0)
	if err != nil {
		return nil, fmt.Errorf("inline schema %s: %w", id, err)
	}
	if m, ok := v.(map[string]any); ok { // the root keeps its $schema and $id
		root := in.docs[id].(map[string]any)
		for _, k := range []string{"$schema", "$id"} {
			if x, ok := root[k]; ok {
				m[k] = x
			}
		}
	}
	return json.Marshal(v)
}

// keywordOf says what a keyword's value is: a schema, a list of
// schemas, a map of names to schemas; or "" when it is copied as it is.
func keywordOf(k string) string {
	switch k {
	case "additionalProperties", "unevaluatedProperties", "items", "contains", "propertyNames", "not",
		"if", "then", "else", "unevaluatedItems", "additionalItems", "contentSchema":
		return "schema"
	case "allOf", "anyOf", "oneOf", "prefixItems":
		return "list"
	case "properties", "patternProperties", "dependentSchemas":
		return "map"
	}
	return ""
}

// isAnnotation reports whether a keyword only annotates.
func isAnnotation(k string) bool {
	switch k {
	case "title", "description", "$comment", "default", "examples", "readOnly", "writeOnly", "deprecated":
		return true
	}
	return false
}

// schema returns v, a schema of the document base, with its references
// inlined; depth counts the references followed to reach it.
func (in inliner) schema(v any, base string, depth int) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return v, nil // true, false
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		var err error
		switch {
		case k == "$ref" || k == "$defs" || k == "$id" || k == "$schema":
			continue // inlined, or the root's (standalone)
		case k == "$comment":
			continue // for the schema's authors, not for the agent that reads a tool's schema
		case keywordOf(k) == "schema":
			out[k], err = in.schema(x, base, depth)
		case keywordOf(k) == "list":
			list, _ := x.([]any)
			subs := make([]any, len(list))
			for i, sub := range list {
				if subs[i], err = in.schema(sub, base, depth); err != nil {
					break
				}
			}
			out[k] = subs
		case keywordOf(k) == "map":
			names, _ := x.(map[string]any)
			subs := make(map[string]any, len(names))
			for name, sub := range names {
				if subs[name], err = in.schema(sub, base, depth); err != nil {
					break
				}
			}
			out[k] = subs
		default:
			out[k] = x
		}
		if err != nil {
			return nil, err
		}
	}
	ref, ok := m["$ref"].(string)
	if !ok {
		return out, nil
	}
	if depth >= maxInline {
		return nil, fmt.Errorf("references nested deeper than %d (a cycle?) at %s", maxInline, ref)
	}
	target, tbase, err := in.resolve(ref, base)
	if err != nil {
		return nil, err
	}
	inlined, err := in.schema(target, tbase, depth+1)
	if err != nil {
		return nil, err
	}
	onlyNotes := true
	for k := range out {
		onlyNotes = onlyNotes && isAnnotation(k)
	}
	if t, ok := inlined.(map[string]any); ok && onlyNotes {
		for k, x := range out { // the referring site's words win
			t[k] = x
		}
		return t, nil
	}
	if len(out) == 0 {
		return inlined, nil
	}
	all, _ := out["allOf"].([]any)
	out["allOf"] = append(all, inlined)
	return out, nil
}

// resolve finds the schema a reference names, in the embedded set only,
// and the $id of its document.
func (in inliner) resolve(ref, base string) (any, string, error) {
	doc, frag, _ := strings.Cut(ref, "#")
	if doc == "" {
		doc = base
	}
	v, ok := in.docs[doc]
	if !ok {
		return nil, "", fmt.Errorf("reference %s is not in the embedded set", ref)
	}
	if frag == "" {
		return v, doc, nil
	}
	if !strings.HasPrefix(frag, "/") {
		return nil, "", fmt.Errorf("reference %s: only JSON pointers are inlined", ref)
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := v.(map[string]any)
		if !ok {
			return nil, "", fmt.Errorf("reference %s: no such schema", ref)
		}
		if v, ok = m[tok]; !ok {
			return nil, "", fmt.Errorf("reference %s: no such schema", ref)
		}
	}
	return v, doc, nil
}
