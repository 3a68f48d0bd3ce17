package interop

import (
	"slices"
	"testing"
)

// TestListPages lists a fleet too large for one page of tools/list (the
// Go SDK's default page is 1,000 tools) with the TypeScript client,
// following nextCursor to the end: every tool appears once.
func TestListPages(t *testing.T) {
	const mock = 260 // 4 tools each for a read-only token: 1,040
	o := startOkso(t, mock)
	var l listed
	runScript(t, clientEnv(o.mcpURL, o.token), &l, "list.mjs")
	if len(l.Pages) < 2 {
		t.Errorf("%d tools came in %d page(s); want more than one page", len(l.Tools), len(l.Pages))
	}
	want := readOnlyToolsOf(o.nodes)
	got := l.names()
	slices.Sort(got)
	if dup := duplicates(got); len(dup) > 0 {
		t.Errorf("listed more than once: %v", dup)
	}
	if distinct := slices.Compact(slices.Clone(got)); !slices.Equal(distinct, want) {
		t.Errorf("listed %d distinct tools in pages %v, want the %d of %d nodes and okso's own", len(distinct), l.Pages, len(want), mock)
	}
}

// duplicates returns the names a sorted list holds more than once.
func duplicates(sorted []string) []string {
	var dup []string
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] && (len(dup) == 0 || dup[len(dup)-1] != sorted[i]) {
			dup = append(dup, sorted[i])
		}
	}
	return dup
}
