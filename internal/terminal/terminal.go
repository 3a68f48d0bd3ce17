// Package terminal tells whether a writer is a terminal, where a person
// reads what a process writes rather than a pipeline: okso's log defaults
// (text, no audit lines) follow from it.
package terminal

import (
	"io"
	"os"
)

// Is reports whether w is a terminal (a character device).
func Is(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
