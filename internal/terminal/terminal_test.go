package terminal

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestIs: neither a pipe, nor a file, nor a buffer is a terminal. (A
// pseudo-terminal is one: roles' TestConsoleOnATerminal runs okso on one.)
func TestIs(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, out := range []*os.File{w, f} {
		if Is(out) {
			t.Errorf("%s taken for a terminal", out.Name())
		}
	}
	if Is(&bytes.Buffer{}) {
		t.Error("a buffer taken for a terminal")
	}
}
