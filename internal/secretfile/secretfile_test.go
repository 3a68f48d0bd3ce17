package secretfile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/okso-io/okso/internal/secretfile"
)

// TestKeepRace: processes that start together on a fresh data dir all
// read one secret, kept with mode 0600, made again by none later.
func TestKeepRace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "secret")
	got := make([]string, 8)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() {
			b, err := secretfile.Keep(file, func() ([]byte, error) { return fmt.Appendf(nil, "secret %d", i), nil })
			if err != nil {
				t.Error(err)
			}
			got[i] = string(b)
		})
	}
	wg.Wait()
	for _, g := range got {
		if g != got[0] {
			t.Fatalf("secrets read %q: not one", got)
		}
	}
	b, err := secretfile.Keep(file, func() ([]byte, error) { return []byte("later"), nil })
	if err != nil || string(b) != got[0] {
		t.Errorf("Keep later: %q, %v, want %q", b, err, got[0])
	}
	if err := secretfile.OwnerOnly(file); err != nil {
		t.Error(err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := secretfile.OwnerOnly(file); err == nil {
		t.Error("OwnerOnly accepted a secret readable by others")
	}
}
