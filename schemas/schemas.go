// Package schemas is okso's contract, written once: the JSON Schema
// (draft 2020-12) files in this directory, embedded in the binary, and the
// vocabulary they imply, which the tier, the gateway and the device side
// all take from here: the table of capability kinds that says which
// schema each verb uses (kinds.go: the built-in kinds; kinddef.go: the
// [KindTable] with the kinds an operator registers, kind@1.0.0), the rules of node ids, tenants and
// tool names (names.go), and the closed set of error codes (errors.go).
// The remote tier's config file is a contract too, remotes.config@1.0.0,
// and so is the gateway's file of trusted OAuth issuers, oauth.issuers@1.0.0.
// okso's own fleet tools have theirs: fleet.nodes and fleet.call, which
// share the filters of fleet.selector@1.0.0, and okso.find_tools, each an
// input and an output schema (FleetNodesInput and the constants beside it).
// Every tool input schema is flat, as agent hosts and model APIs require
// (no $ref, no top-level composition); a rule that does not fit there is
// in its description and checked by the gateway.
// Where a hand-written check is kept for speed, a test or fuzz target
// proves it agrees with the schema or regular expression it stands for.
//
// Start with [Load], which compiles every schema once; then validate with
// [Set.Validate] or [Set.ValidateJSON] and serve the files with
// [Set.Handler]; give a tool the self-contained form of its schema,
// [Set.Standalone]. A schema is named by its $id, mcp://schemas/<name>@<version>.
// References are resolved only inside the embedded set: nothing is ever
// fetched from the network or the file system.
package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// IDPrefix begins the $id of every okso schema.
const IDPrefix = "mcp://schemas/"

// Well-known schema ids.
const (
	EchoInput        = IDPrefix + "system.echo.invoke.input@1.0.0"
	EchoOutput       = IDPrefix + "system.echo.invoke.output@1.0.0"
	MetricsSnapInput = IDPrefix + "system.metrics.snapshot.input@1.0.0"
	MetricsSnapshot  = IDPrefix + "system.metrics.snapshot.output@1.0.0"
	MetricsSubInput  = IDPrefix + "system.metrics.subscribe.input@1.0.0"
	MetricsFrame     = IDPrefix + "system.metrics.subscribe.frame@1.0.0"
	MetricsSubOutput = IDPrefix + "system.metrics.subscribe.output@1.0.0"
	GPIOReadInput    = IDPrefix + "sim.gpio.read.input@1.0.0"
	GPIORead         = IDPrefix + "sim.gpio.read.output@1.0.0"
	GPIOWriteInput   = IDPrefix + "sim.gpio.write.input@1.0.0"
	GPIOWrite        = IDPrefix + "sim.gpio.write.output@1.0.0"
	LocalRunInput    = IDPrefix + "local.tool.run.input@1.0.0"
	LocalRun         = IDPrefix + "local.tool.run.output@1.0.0"
	// AgentTools is the contract of okso agent's --tools file.
	AgentTools    = IDPrefix + "agent.tools@1.0.0"
	Manifest      = IDPrefix + "manifest@1.0.0"
	Envelope      = IDPrefix + "envelope@1.0.0"
	ErrorEnvelope = IDPrefix + "error@1.0.0"

	// The fleet tools' arguments and results (DESIGN.md §8, issue 30).
	// FleetSelector is the one statement of the filters fleet.nodes and
	// fleet.call share. Their input schemas copy its properties rather
	// than refer to it: a tool's inputSchema goes to model APIs, which
	// refuse $ref and composition in it, so every tool input schema is
	// flat (TestHostSafe), and the copies are held equal (TestSelectorCopies).
	FleetSelector    = IDPrefix + "fleet.selector@1.0.0"
	FleetNodesInput  = IDPrefix + "fleet.nodes.input@1.0.0"
	FleetNodesOutput = IDPrefix + "fleet.nodes.output@1.0.0"
	FleetCallInput   = IDPrefix + "fleet.call.input@1.0.0"
	FleetCallOutput  = IDPrefix + "fleet.call.output@1.0.0"
	FindToolsInput   = IDPrefix + "okso.find_tools.input@1.0.0"
	FindToolsOutput  = IDPrefix + "okso.find_tools.output@1.0.0"
)

//go:embed *.json
var files embed.FS

// Set is the compiled, read-only set of embedded schemas. It is safe for
// concurrent use. The zero value is not usable; call [Load].
type Set struct {
	compiled map[string]*jsonschema.Schema
	quick    map[string]*quick // the schemas of the plain shape, by $id
	raw      map[string][]byte // by $id
	decoded  map[string]json.RawMessage
	// standalone: each schema with its references inlined (standalone.go)
	standalone map[string]json.RawMessage
}

// refuseLoader refuses every URL that is not one of the embedded resources,
// so a schema can never make okso fetch http:// or file:// documents.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema %s is not in the embedded set", url)
}

// Load compiles every embedded schema. It fails if a file is malformed, has
// no $id under [IDPrefix], or refers outside the embedded set.
func Load() (*Set, error) {
	s := &Set{
		compiled: map[string]*jsonschema.Schema{},
		quick:    map[string]*quick{},
		raw:      map[string][]byte{},
		decoded:  map[string]json.RawMessage{},

		standalone: map[string]json.RawMessage{},
	}
	docs := map[string]any{}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	names, err := fs.Glob(files, "*.json")
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		b, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("schema file %s: %w", name, err)
		}
		obj, _ := doc.(map[string]any)
		id, _ := obj["$id"].(string)
		if !strings.HasPrefix(id, IDPrefix) || strings.TrimSuffix(name, ".json") != strings.TrimPrefix(id, IDPrefix) {
			return nil, fmt.Errorf("schema file %s: $id %q does not match its file name", name, id)
		}
		if err := c.AddResource(id, doc); err != nil {
			return nil, fmt.Errorf("schema %s: %w", id, err)
		}
		s.raw[id] = b
		docs[id] = doc
		s.decoded[id] = json.RawMessage(b)
		if q := compileQuick(doc); q != nil {
			s.quick[id] = q
		}
	}
	for id := range s.raw {
		sch, err := c.Compile(id)
		if err != nil {
			return nil, fmt.Errorf("compile schema %s: %w", id, err)
		}
		s.compiled[id] = sch
		if s.standalone[id], err = (inliner{docs}).standalone(id); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Has reports whether id names an embedded schema.
func (s *Set) Has(id string) bool { _, ok := s.compiled[id]; return ok }

// Raw returns the schema document with the given $id, as embedded. The
// returned slice must not be modified.
func (s *Set) Raw(id string) (json.RawMessage, bool) {
	b, ok := s.decoded[id]
	return b, ok
}

// ErrUnknownSchema is returned when validating against an id that is not in
// the embedded set.
var ErrUnknownSchema = errors.New("unknown schema")

// Validate checks a value decoded by [Decode] (or made of map[string]any,
// []any, string, json.Number, bool and nil) against the schema with the
// given $id.
func (s *Set) Validate(id string, v any) error {
	sch, ok := s.compiled[id]
	if !ok {
		return fmt.Errorf("%w %s", ErrUnknownSchema, id)
	}
	if q := s.quick[id]; q != nil && q.accepts(v) {
		return nil
	}
	// The bounds every check keeps (a number's size; bounds.go).
	if _, err := checkValue(v, false); err != nil {
		return err
	}
	return sch.Validate(v)
}

// ValidateJSON decodes one JSON document and validates it against the
// schema with the given $id. Trailing data after the document is an error.
func (s *Set) ValidateJSON(id string, doc []byte) error {
	if q := s.quick[id]; q != nil && q.acceptsJSON(doc) {
		return nil
	}
	v, err := Decode(doc)
	if err != nil {
		return err
	}
	return s.Validate(id, v)
}

// Handler serves GET /schemas/<name>@<version> (the $id without its
// prefix) with the embedded document.
func (s *Set) Handler() http.Handler { return s.HandlerWith(nil) }

// HandlerWith serves the embedded documents as [Set.Handler] does, and
// the registered kinds' schemas of the table kinds returns at each
// request (kinds nil, or returning nil: none).
func (s *Set) HandlerWith(kinds func() *KindTable) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/schemas/")
		b, ok := s.raw[IDPrefix+name]
		if !ok && kinds != nil {
			var ks *KindSchema
			if ks, ok = kinds().Schema(IDPrefix + name); ok {
				b = ks.Doc
			}
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/schema+json")
		w.Header().Set("Cache-Control", "public, max-age=3600")
		_, _ = w.Write(b)
	})
}
