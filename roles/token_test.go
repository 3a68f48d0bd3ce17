package roles

import (
	"bytes"
	"strings"
	"testing"
)

// TestTokenMintRefuses: okso token mint refuses what would give a token
// that does not do what its user meant, with a message naming the flag.
func TestTokenMintRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--scope", "tools:call:readonly"}, `--scope "tools:call:readonly": want tools:call:read_only`},
		{[]string{"--scope", "tools:call:read_only admin"}, `--scope "admin"`},
		{[]string{"--scope", "device:connect"}, "--scope device:connect is a device token's"},
		{[]string{"--ttl", "0s"}, "--ttl 0s: a token needs a validity above zero"},
		{[]string{"--ttl", "-1h"}, "--ttl -1h0m0s"},
		{[]string{"--tenant", "acme.eu"}, `--tenant "acme.eu"`},
		{[]string{"--tenant", ""}, `--tenant ""`},
	} {
		var out bytes.Buffer
		root := NewRoot(&out, &out)
		root.SetArgs(append([]string{"token", "mint", "--data-dir", dir}, c.args...))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("mint %v: %v, want an error with %q", c.args, err, c.want)
		}
		if out.Len() != 0 {
			t.Errorf("mint %v printed %q", c.args, out.String())
		}
	}
	var out bytes.Buffer
	root := NewRoot(&out, &out)
	root.SetArgs([]string{"token", "mint", "--data-dir", dir, "--scope", "tools:call:mutating", "--ttl", "2h"})
	if err := root.Execute(); err != nil || strings.Count(out.String(), ".") != 2 {
		t.Errorf("a good mint: %v %q", err, out.String())
	}
}
