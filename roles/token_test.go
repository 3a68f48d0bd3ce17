package roles

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
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
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs([]string{"token", "mint", "--data-dir", dir, "--scope", "tools:call:mutating", "--ttl", "2h"})
	if err := root.Execute(); err != nil || strings.Count(out.String(), ".") != 2 {
		t.Errorf("a good mint: %v %q", err, out.String())
	}
}

// TestTokenMintValidity: an agent token is valid 30 days unless --ttl
// says otherwise (so one pasted into an agent host's configuration keeps
// working), a device token 1 h; stdout is the bare token, for scripts,
// and stderr says how long it is valid and until when.
func TestTokenMintValidity(t *testing.T) {
	dir := t.TempDir()
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	for _, c := range []struct {
		args []string
		ttl  time.Duration
		kind string
		says string
	}{
		{nil, 30 * 24 * time.Hour, "agent", "30 days"},
		{[]string{"--scope", auth.ScopeDestructive}, 30 * 24 * time.Hour, "agent", "30 days"},
		{[]string{"--ttl", "90m"}, 90 * time.Minute, "agent", "1h30m0s"},
		{[]string{"--ttl", "48h"}, 48 * time.Hour, "agent", "2 days"},
		{[]string{"--device", "--node-id", node}, time.Hour, "device", "1h0m0s"},
		{[]string{"--device", "--node-id", node, "--ttl", "8760h"}, 365 * 24 * time.Hour, "device", "365 days"},
	} {
		var out, errOut bytes.Buffer
		root := NewRoot(&out, &errOut)
		root.SetArgs(append([]string{"token", "mint", "--data-dir", dir}, c.args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("mint %v: %v", c.args, err)
		}
		tok, ok := strings.CutSuffix(out.String(), "\n")
		if !ok || strings.ContainsAny(tok, " \n") {
			t.Fatalf("mint %v: stdout %q, want the bare token and a newline", c.args, out.String())
		}
		claims, err := auth.UnverifiedClaims(tok)
		if err != nil {
			t.Fatalf("mint %v: %v", c.args, err)
		}
		if got := claims.ExpiresAt.Sub(claims.IssuedAt.Time); got != c.ttl {
			t.Errorf("mint %v: valid %v, want %v", c.args, got, c.ttl)
		}
		want := c.kind + " token valid for " + c.says + ", until " + claims.ExpiresAt.UTC().Format(time.RFC3339) + " (--ttl to change)\n"
		if errOut.String() != want {
			t.Errorf("mint %v: stderr %q, want %q", c.args, errOut.String(), want)
		}
	}

	var help bytes.Buffer
	root := NewRoot(&help, &help)
	root.SetArgs([]string{"token", "mint", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(help.String(), "720h (30 days) for an agent token, 1h with --device") {
		t.Errorf("token mint --help does not say the defaults of --ttl:\n%s", help.String())
	}
}
