// Package results writes the figures of okso's load tools (scalecheck,
// fleetbench) as key=value lines, sorted by key, for their scripts'
// summary tables to read.
package results

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// Write writes res to path, one key=value line each, sorted by key.
func Write(path string, res map[string]string) error {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(res)) {
		fmt.Fprintf(&b, "%s=%s\n", k, res[k])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
