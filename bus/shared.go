package bus

import (
	"encoding/json"
	"sync"
	"unique"
	"unsafe"
	"weak"

	"github.com/okso-io/okso/schemas"
)

// A gateway holds every node's record, and the nodes of one fleet
// announce the same capabilities: one agent version, one tools file. So
// the followed records share one decoded capabilities array per distinct
// text, for as long as any record holds it (a weak map: an array no
// record holds is collected, and its entry forgotten). Records are
// read-only once decoded, so sharing is safe.

// sharedCaps maps a capabilities array's JSON text to its decoded,
// interned array.
var sharedCaps = struct {
	sync.Mutex
	m     map[string]capsRef
	sweep int // len(m) at which stale entries are dropped next
}{m: map[string]capsRef{}, sweep: 64}

// capsRef is a weak reference to a decoded array: its first element and
// its length.
type capsRef struct {
	first weak.Pointer[schemas.Capability]
	n     int
}

// capabilities returns the decoded array of raw, shared with every
// record whose array has the same text.
func capabilities(raw json.RawMessage) ([]schemas.Capability, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	sharedCaps.Lock()
	if r, ok := sharedCaps.m[string(raw)]; ok {
		if p := r.first.Value(); p != nil {
			sharedCaps.Unlock()
			return unsafe.Slice(p, r.n), nil
		}
	}
	sharedCaps.Unlock()
	var caps []schemas.Capability
	if err := json.Unmarshal(raw, &caps); err != nil {
		return nil, err
	}
	if len(caps) == 0 {
		return caps, nil
	}
	internCaps(caps)
	sharedCaps.Lock()
	defer sharedCaps.Unlock()
	if r, ok := sharedCaps.m[string(raw)]; ok { // decoded meanwhile by another follower
		if p := r.first.Value(); p != nil {
			return unsafe.Slice(p, r.n), nil
		}
	}
	if len(sharedCaps.m) >= sharedCaps.sweep {
		for k, r := range sharedCaps.m {
			if r.first.Value() == nil {
				delete(sharedCaps.m, k)
			}
		}
		sharedCaps.sweep = max(64, 2*len(sharedCaps.m))
	}
	sharedCaps.m[string(raw)] = capsRef{first: weak.Make(&caps[0]), n: len(caps)}
	return caps, nil
}

// internCaps makes the strings of capabilities that repeat across
// arrays (kinds, schemas, classes, verbs, descriptions) share one copy.
func internCaps(caps []schemas.Capability) {
	in := func(s *string) { *s = unique.Make(*s).Value() }
	for i := range caps {
		c := &caps[i]
		for _, s := range []*string{&c.CapID, &c.Kind, &c.SchemaRef, &c.SafetyClass} {
			in(s)
		}
		if c.Description != "" {
			in(&c.Description)
		}
		for j := range c.Verbs {
			in(&c.Verbs[j])
		}
	}
}

// nodeFields is Node without its methods, for decodeRecord to embed.
type nodeFields Node

// decodeRecord decodes a followed record: its capabilities shared
// ([capabilities]) and its repeated strings interned.
func decodeRecord(b []byte) (*Node, error) {
	n := &Node{}
	w := struct {
		*nodeFields
		Capabilities json.RawMessage `json:"capabilities"` // shadows the record's
		Labels       json.RawMessage `json:"labels"`       // and these
	}{nodeFields: (*nodeFields)(n)}
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, err
	}
	caps, err := capabilities(w.Capabilities)
	if err != nil {
		return nil, err
	}
	n.Capabilities = caps
	if n.Labels, err = labels(w.Labels); err != nil {
		return nil, err
	}
	in := func(s *string) { *s = unique.Make(*s).Value() }
	for _, s := range []*string{&n.Tenant, &n.Tier, &n.Agent.Name, &n.Agent.Version, &n.State} {
		in(s)
	}
	return n, nil
}

// A fleet's nodes carry few distinct label sets (a site, a model, a
// zone), and a small map costs more than the rest of a record: so the
// followed records share one decoded map per distinct text too. A map
// has no address a weak pointer could follow, so the shared maps are
// held strongly, at most maxSharedLabels of them: when full, sharing
// starts again empty (the maps already shared stay with their records).

// maxSharedLabels bounds the label sets shared at once.
const maxSharedLabels = 4096

var sharedLabels = struct {
	sync.Mutex
	m map[string]map[string]string
}{m: map[string]map[string]string{}}

// labels returns the decoded labels of raw, shared with every record
// whose labels have the same text; nil for none (absent, or null).
func labels(raw json.RawMessage) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	sharedLabels.Lock()
	l, ok := sharedLabels.m[string(raw)]
	sharedLabels.Unlock()
	if ok {
		return l, nil
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, err
	}
	sharedLabels.Lock()
	defer sharedLabels.Unlock()
	if len(sharedLabels.m) >= maxSharedLabels {
		clear(sharedLabels.m)
	}
	sharedLabels.m[string(raw)] = l
	return l, nil
}
