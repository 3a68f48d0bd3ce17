package roles

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// fleetIDs returns the node ids of a fleet of kind, n devices of tenant
// with seed, made with c (not run).
func fleetIDs(t *testing.T, c *common, kind fleetKind, n int, tenant string, seed uint64, ids ...string) []string {
	t.Helper()
	f, err := newFleetPart(c, kind, n, tenant, []string{"ws://127.0.0.1:1/v1/device/ws"}, nil, seed, ids...)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range f.devices {
		got = append(got, d.NodeID())
	}
	return got
}

// TestMockNodeIDsAcrossRestarts: all-in-one's simulated devices get the
// same node ids when it starts again on its data dir with its seed, so
// the tool names an agent host saved still work.
func TestMockNodeIDsAcrossRestarts(t *testing.T) {
	dataDir := t.TempDir()
	cfg := func(c *AllInOneConfig) { c.DataDir, c.Seed = dataDir, 7 }
	ids := func(f *fixture) []string {
		var ids []string
		for _, d := range f.a.fleet.devices {
			ids = append(ids, d.NodeID())
		}
		return ids
	}
	f := startAllInOne(t, 3, cfg)
	first := ids(f)
	f.stop()
	f = startAllInOne(t, 3, cfg)
	if again := ids(f); !slices.Equal(again, first) {
		t.Errorf("node ids after the restart %v, were %v", again, first)
	}
	for _, id := range first {
		if !schemas.ValidNodeID(id) {
			t.Errorf("node id %q: not a node id", id)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(first)))) != len(first) {
		t.Errorf("node ids %v: some twice", first)
	}
	fi, err := os.Stat(filepath.Join(dataDir, mockKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Errorf("%s mode %#o, want 0600", mockKeyFile, m)
	}
}

// TestMockNodeIDsApart: another data dir, seed, tenant or kind of fleet
// gets other node ids; node ids given come first.
func TestMockNodeIDsApart(t *testing.T) {
	load := func() *common {
		c, err := loadCommon(slog.New(slog.DiscardHandler), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c, other := load(), load()
	base := fleetIDs(t, c, fleetAllInOne, 2, DefaultTenant, 1)
	if again := fleetIDs(t, c, fleetAllInOne, 2, DefaultTenant, 1); !slices.Equal(again, base) {
		t.Fatalf("same data dir, kind, tenant and seed: %v, then %v", base, again)
	}
	for _, tc := range []struct {
		name string
		ids  []string
	}{
		{"another data dir", fleetIDs(t, other, fleetAllInOne, 2, DefaultTenant, 1)},
		{"another seed", fleetIDs(t, c, fleetAllInOne, 2, DefaultTenant, 2)},
		{"another tenant", fleetIDs(t, c, fleetAllInOne, 2, "other", 1)},
		{"mock-fleet", fleetIDs(t, c, fleetMock, 2, DefaultTenant, 1)},
		{"a device tier's", fleetIDs(t, c, fleetDevice, 2, DefaultTenant, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, id := range tc.ids {
				if !schemas.ValidNodeID(id) {
					t.Errorf("node id %q: not a node id", id)
				}
				if slices.Contains(base, id) {
					t.Errorf("node ids %v share %s with all-in-one's %v", tc.ids, id, base)
				}
			}
		})
	}

	given := "01jz3k9v7q8r2s4t6w8x0y2z4b"
	ids := fleetIDs(t, c, fleetMock, 2, DefaultTenant, 1, given)
	if ids[0] != given || ids[1] != fleetIDs(t, c, fleetMock, 2, DefaultTenant, 1)[1] {
		t.Errorf("with node id %s given: %v, want it first, then the second derived one", given, ids)
	}
}
