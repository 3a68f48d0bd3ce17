package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Kinds an operator registers (DESIGN.md §12): a definition
// (kind@1.0.0) names the kind, its kind_short, its safety clamp and its
// verbs with their schemas. The admin writes it to KV okso_kinds (okso
// kinds apply); every gateway and tier builds a [KindTable] of the
// built-in kinds and the registered ones, and projects manifests with
// it. The enum of seed 000 §10 stays closed: only the admin opens it.

// KindDefinition is the contract of a kind definition.
const KindDefinition = IDPrefix + "kind@1.0.0"

// MaxKindDefinition bounds a definition with its schemas: its verbs'
// schemas are foreign ones ([MaxForeignSchema] each), and the whole is
// one NATS message.
const MaxKindDefinition = 512 << 10

// MaxKindShortVerb bounds a registered kind's kind_short and verb
// together, so that every name it projects, with a cap_id of the
// manifest's 24 characters and a node id's 26, is within [MaxToolName]:
// 64 - 26 - 24 - 3 dots. (The built-in kinds are older than the rule:
// Project refuses a name of theirs that a long cap_id makes too long.)
const MaxKindShortVerb = MaxToolName - 26 - 24 - 3

// KindDef is a checked and compiled kind definition. Read-only.
type KindDef struct {
	// Kind is its table entry: the verbs' Input and Output are their
	// schemas' $ids.
	Kind
	// Version is the definition's semantic version.
	Version string
	// Doc is the definition as stored: canonical JSON (members sorted,
	// no spaces), the schemas inline. Two definitions are the same when
	// their Docs are.
	Doc json.RawMessage
	// Schemas are its verbs' schemas, by $id.
	Schemas map[string]*KindSchema
}

// Key is the definition's key in KV okso_kinds: the kind and its major,
// as <kind>.v<major>. (DESIGN.md writes <kind>@<major>, but a NATS KV key
// may not hold '@': its keys are ^[-/_=.a-zA-Z0-9]+$.)
func (d *KindDef) Key() string { return KindKey(d.Name, d.Major) }

// KindKey is the key of a kind's major in KV okso_kinds.
func KindKey(name string, major int) string { return name + ".v" + strconv.Itoa(major) }

// KindSchema is one schema of a registered kind: its document, compact,
// and its compiled form, within the bounds of foreign schemas.
type KindSchema struct {
	ID      string
	Doc     json.RawMessage // compact; read-only
	Foreign *Foreign
}

var (
	semverRe   = regexp.MustCompile(`^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$`)
	schemaIDRe = regexp.MustCompile(`^mcp://schemas/([a-z0-9_.]+)\.(input|output)@((0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5}))$`)
)

// majorOf returns the major of a semantic version (-1 when it is not one).
func majorOf(v string) int {
	m := semverRe.FindStringSubmatch(v)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// refMajor returns the major version of a schema_ref ($id), -1 when it
// has none.
func refMajor(ref string) int {
	at := strings.LastIndexByte(ref, '@')
	if at < 0 {
		return -1
	}
	return majorOf(ref[at+1:])
}

// IsBuiltinKind reports whether name is a built-in kind.
func IsBuiltinKind(name string) bool { _, ok := kinds[name]; return ok }

// CompileKind checks a kind definition in its stored form (the schemas
// inline) and compiles its schemas. It checks, beyond kind@1.0.0: that
// it redefines no built-in kind or kind_short and takes no reserved
// name; that kind_short and each verb are at most [MaxKindShortVerb]
// characters together; that the verbs differ; and that each schema is
// a JSON object whose $id is mcp://schemas/<kind>.<verb>.input|output@
// a version of the definition's major, of type object (a result's
// requiring node_id, which the gateway checks against the node it
// called), and compiles within the bounds of foreign schemas. Errors
// name the verb and schema at fault, in okso's words.
func (s *Set) CompileKind(raw []byte) (*KindDef, error) {
	if len(raw) > MaxKindDefinition {
		return nil, fmt.Errorf("definition larger than %d bytes", MaxKindDefinition)
	}
	v, err := Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	if err := s.Validate(KindDefinition, v); err != nil {
		return nil, fmt.Errorf("definition fails %s: %s", KindDefinition, s.Explain(KindDefinition, err))
	}
	doc, err := json.Marshal(v) // canonical: members sorted
	if err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	var def struct {
		Name       string `json:"name"`
		Short      string `json:"kind_short"`
		Safety     string `json:"safety"`
		Idempotent bool   `json:"idempotent"`
		Version    string `json:"version"`
		Verbs      []struct {
			Name   string          `json:"name"`
			Title  string          `json:"title"`
			Input  json.RawMessage `json:"input"`
			Output json.RawMessage `json:"output"`
		} `json:"verbs"`
	}
	if err := json.Unmarshal(doc, &def); err != nil {
		return nil, fmt.Errorf("definition: %w", err)
	}
	switch {
	case IsBuiltinKind(def.Name):
		return nil, fmt.Errorf("kind %s is built in: it cannot be redefined", def.Name)
	case IsKindShort(def.Short):
		return nil, fmt.Errorf("kind_short %s is a built-in kind's", def.Short)
	case IsReserved(def.Short):
		return nil, fmt.Errorf("kind_short %s is reserved for okso's own tools", def.Short)
	}
	d := &KindDef{Kind: Kind{Name: def.Name, Short: def.Short, Idempotent: def.Idempotent, Major: majorOf(def.Version)},
		Version: def.Version, Doc: doc, Schemas: map[string]*KindSchema{}}
	if def.Safety != "any" {
		d.Safety = def.Safety
	}
	if d.Major < 1 {
		return nil, fmt.Errorf("version %s: a registered kind's major is at least 1", def.Version)
	}
	for _, vb := range def.Verbs {
		if _, dup := d.Verb(vb.Name); dup {
			return nil, fmt.Errorf("verb %s is defined twice", vb.Name)
		}
		if n := len(def.Short) + len(vb.Name); n > MaxKindShortVerb {
			return nil, fmt.Errorf("verb %s: kind_short and verb are %d characters together, at most %d (so that every tool name, with a 24-character cap_id, is within %d)",
				vb.Name, n, MaxKindShortVerb, MaxToolName)
		}
		in, err := d.compileSchema(vb.Name, "input", vb.Input)
		if err != nil {
			return nil, err
		}
		out, err := d.compileSchema(vb.Name, "output", vb.Output)
		if err != nil {
			return nil, err
		}
		d.Verbs = append(d.Verbs, Verb{Name: vb.Name, Title: vb.Title, Input: in.ID, Output: out.ID})
	}
	return d, nil
}

// compileSchema checks and compiles one schema of verb (which is input
// or output).
func (d *KindDef) compileSchema(verb, which string, raw json.RawMessage) (*KindSchema, error) {
	at := fmt.Sprintf("verb %s %s schema", verb, which)
	var doc map[string]any
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &doc) != nil {
		return nil, fmt.Errorf("%s: not a JSON object", at)
	}
	id, _ := doc["$id"].(string)
	m := schemaIDRe.FindStringSubmatch(id)
	if m == nil || m[1] != d.Name+"."+verb || m[2] != which {
		return nil, fmt.Errorf("%s: $id must be %s%s.%s.%s@<version>", at, IDPrefix, d.Name, verb, which)
	}
	if majorOf(m[3]) != d.Major {
		return nil, fmt.Errorf("%s: $id's version %s is not of the definition's major %d", at, m[3], d.Major)
	}
	if _, dup := d.Schemas[id]; dup {
		return nil, fmt.Errorf("%s: $id %s is used twice", at, id)
	}
	if doc["type"] != "object" {
		return nil, fmt.Errorf("%s: its top level must be type object", at)
	}
	if which == "output" {
		req, _ := doc["required"].([]any)
		if !slices.Contains(req, any("node_id")) {
			return nil, fmt.Errorf("%s: must require node_id (a result names the node that answered)", at)
		}
	}
	f, err := CompileForeign(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("%s: %w", at, err)
	}
	ks := &KindSchema{ID: id, Doc: compact.Bytes(), Foreign: f}
	d.Schemas[id] = ks
	return ks, nil
}

// KindTable is the kind table one gateway or tier projects manifests
// with: the built-in kinds and the registered ones it knows. It is
// immutable once made, and safe for concurrent use; a nil *KindTable is
// the built-in kinds alone.
type KindTable struct {
	byName  map[string][]Kind // registered, by name, by major ascending
	shorts  map[string]string // registered kind_short -> kind
	schemas map[string]*KindSchema
	defs    []*KindDef
}

// NewKindTable makes a table of the built-in kinds and defs. A
// definition that conflicts with one before it (by kind, then major) is left
// out, and the error says why: a kind_short another kind has, or
// another major of the same kind with another kind_short. okso kinds
// apply refuses such a definition; two written at once could still
// conflict.
func NewKindTable(defs []*KindDef) (*KindTable, []error) {
	sorted := slices.Clone(defs)
	slices.SortFunc(sorted, func(a, b *KindDef) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return a.Major - b.Major
	})
	t := &KindTable{byName: map[string][]Kind{}, shorts: map[string]string{}, schemas: map[string]*KindSchema{}}
	var errs []error
	for _, d := range sorted {
		if err := t.conflict(d); err != nil {
			errs = append(errs, fmt.Errorf("kind %s: %w", d.Key(), err))
			continue
		}
		t.byName[d.Name] = append(t.byName[d.Name], d.Kind)
		slices.SortFunc(t.byName[d.Name], func(a, b Kind) int { return a.Major - b.Major })
		t.shorts[d.Short] = d.Name
		for id, s := range d.Schemas {
			t.schemas[id] = s
		}
		t.defs = append(t.defs, d)
	}
	return t, errs
}

// Conflict says why d could not join the table, or nil.
func (t *KindTable) Conflict(d *KindDef) error {
	if err := t.conflict(d); err != nil {
		return err
	}
	for _, m := range t.byName[d.Name] {
		if m.Major == d.Major {
			return fmt.Errorf("kind %s is registered already", d.Key())
		}
	}
	return nil
}

func (t *KindTable) conflict(d *KindDef) error {
	if t == nil {
		return nil
	}
	if IsBuiltinKind(d.Name) || IsKindShort(d.Short) {
		return errors.New("redefines a built-in kind")
	}
	if k, ok := t.shorts[d.Short]; ok && k != d.Name {
		return fmt.Errorf("kind_short %s is kind %s's", d.Short, k)
	}
	if ms := t.byName[d.Name]; len(ms) > 0 && ms[0].Short != d.Short {
		return fmt.Errorf("kind_short %s differs from its other major's, %s", d.Short, ms[0].Short)
	}
	return nil
}

// Defs are the registered definitions the table holds, by kind and major.
func (t *KindTable) Defs() []*KindDef {
	if t == nil {
		return nil
	}
	return t.defs
}

// Lookup returns the entry of a kind: a built-in one, or a registered
// one's latest major.
func (t *KindTable) Lookup(name string) (Kind, bool) {
	if k, ok := kinds[name]; ok {
		return k, true
	}
	if t == nil {
		return Kind{}, false
	}
	ms := t.byName[name]
	if len(ms) == 0 {
		return Kind{}, false
	}
	return ms[len(ms)-1], true
}

// lookupRef returns the entry of a kind that a capability names, with
// its schema_ref: for a registered kind, the major its schema_ref says.
func (t *KindTable) lookupRef(name, ref string) (Kind, bool) {
	if k, ok := kinds[name]; ok {
		return k, true
	}
	if t == nil {
		return Kind{}, false
	}
	major := refMajor(ref)
	for _, k := range t.byName[name] {
		if k.Major == major {
			return k, true
		}
	}
	return Kind{}, false
}

// IsKindShort reports whether name is the kind_short of a built-in or a
// registered kind.
func (t *KindTable) IsKindShort(name string) bool {
	if IsKindShort(name) {
		return true
	}
	if t == nil {
		return false
	}
	_, ok := t.shorts[name]
	return ok
}

// Schema returns a registered kind's schema by $id.
func (t *KindTable) Schema(id string) (*KindSchema, bool) {
	if t == nil {
		return nil, false
	}
	s, ok := t.schemas[id]
	return s, ok
}
