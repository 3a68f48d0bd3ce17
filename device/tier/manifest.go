package tier

import (
	"encoding/json"
	"slices"
	"sync"

	"github.com/okso-io/okso/schemas"
)

// A manifest is a session's projected capabilities, which every session
// of the tier that announced the same ones, projected with the same
// kinds, shares read-only: a fleet announces few different manifests,
// and a copy per session was about a kilobyte of the tier's memory per
// device. Make one with [newManifest]; [manifests] shares it.
type manifest struct {
	caps []schemas.Capability // as announced, projected: the record's
	// entries are caps' capabilities in order (one per cap_id), each with
	// its kind: what a session's capState points to.
	entries []capEntry
	key     string // caps as JSON: its key in manifests; "": not shared
	refs    int    // the sessions holding it, under manifests.mu
}

type capEntry struct {
	cap  *schemas.Capability // an element of caps
	kind schemas.Kind
}

// newManifest returns the manifest of caps, whose projected tools are
// tools.
func newManifest(caps []schemas.Capability, tools []schemas.Tool) *manifest {
	m := &manifest{caps: caps, entries: make([]capEntry, 0, len(caps))}
	for _, t := range tools {
		if len(m.entries) > 0 && m.entries[len(m.entries)-1].cap == t.Cap {
			continue // a capability's next verb
		}
		m.entries = append(m.entries, capEntry{cap: t.Cap, kind: t.Kind})
	}
	return m
}

// states returns a session's own state of each of m's capabilities.
func (m *manifest) states() []capState {
	st := make([]capState, len(m.entries))
	for i := range m.entries {
		st[i].capEntry = &m.entries[i]
	}
	return st
}

// manifests are the manifests the tier's sessions share, by key. It is
// safe for concurrent use; the zero value is empty.
type manifests struct {
	mu    sync.Mutex
	byKey map[string]*manifest
}

// share returns the manifest equal to m that sessions hold already, or
// m, held once more either way; each share is undone by a release.
func (ms *manifests) share(m *manifest) *manifest {
	key, err := json.Marshal(m.caps)
	if err != nil {
		return m // not shared
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if held := ms.byKey[string(key)]; held != nil {
		if sameKinds(held.entries, m.entries) {
			held.refs++
			return held
		}
		return m // projected with other kinds (the table changed): not shared
	}
	if ms.byKey == nil {
		ms.byKey = map[string]*manifest{}
	}
	m.key, m.refs = string(key), 1
	ms.byKey[m.key] = m
	return m
}

// release undoes a share of m; nil does nothing.
func (ms *manifests) release(m *manifest) {
	if m == nil || m.key == "" {
		return
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if m.refs--; m.refs == 0 && ms.byKey[m.key] == m {
		delete(ms.byKey, m.key)
	}
}

// sameKinds reports whether a and b, the entries of equal capabilities,
// have equal kinds.
func sameKinds(a, b []capEntry) bool {
	return slices.EqualFunc(a, b, func(x, y capEntry) bool {
		return x.kind.Name == y.kind.Name && x.kind.Short == y.kind.Short && x.kind.Idempotent == y.kind.Idempotent &&
			x.kind.Safety == y.kind.Safety && x.kind.Major == y.kind.Major && slices.Equal(x.kind.Verbs, y.kind.Verbs)
	})
}
