// Package secretfile keeps the secrets okso makes once in a data dir (NATS
// seeds, the route secret, the key of the simulated devices' node ids):
// [Keep] reads a secret file, making it on first use so that processes
// that start together on one data dir agree on it, and [OwnerOnly] refuses
// one that others than its owner may read.
package secretfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Keep returns the contents of file, first writing make's when it does
// not exist. The file is written whole, mode 0600, under a temporary name,
// then linked to its own: when processes race on a fresh data dir, one
// wins and the others read the winner's, never a half-written file. The
// directory must exist.
func Keep(file string, make func() ([]byte, error)) ([]byte, error) {
	b, err := os.ReadFile(file)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return b, err
	}
	data, err := make()
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-*") // mode 0600
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil { // whole on disk before it has its name
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), file); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	return os.ReadFile(file) // ours, or the one that won
}

// OwnerOnly refuses a secret file that others than its owner may read
// (copied with the wrong mode, say), as ssh does a private key.
func OwnerOnly(file string) error {
	fi, err := os.Stat(file)
	if err != nil {
		return err
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return fmt.Errorf("%s is readable by others than its owner (mode %#o): a secret; chmod 600 it", file, m)
	}
	return nil
}
