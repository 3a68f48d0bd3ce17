package roles

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/okso-io/okso/auth"
)

// TestFlagsFromEnvironment: every flag can be set as OKSO_<FLAG>, and the
// command line wins over the environment.
func TestFlagsFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("OKSO_DATA_DIR", dir)
	t.Setenv("OKSO_TENANT", "from-env")
	var out, errOut bytes.Buffer
	root := NewRoot(&out, &errOut)
	root.SetArgs([]string{"token", "mint", "--subject", "someone"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	set, err := loadCommon(nil, dir) // the key was created in OKSO_DATA_DIR
	if err != nil {
		t.Fatal(err)
	}
	c, err := verifierFor(set).Verify(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenant != "from-env" || c.Subject != "someone" {
		t.Errorf("token tenant %q subject %q, want from-env and someone", c.Tenant, c.Subject)
	}

	out.Reset()
	root = NewRoot(&out, &errOut)
	root.SetArgs([]string{"token", "mint", "--tenant", "from-flag"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if c, err := verifierFor(set).Verify(strings.TrimSpace(out.String())); err != nil || c.Tenant != "from-flag" {
		t.Errorf("flag did not win over the environment: %+v %v", c, err)
	}

	t.Setenv("OKSO_MOCK", "not-a-number")
	root = NewRoot(&out, &out)
	root.SetArgs([]string{"all-in-one"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "OKSO_MOCK") {
		t.Errorf("a bad OKSO_MOCK gave %v, want an error naming it", err)
	}
}

// TestVerifyOnlyKey: a role that only verifies runs from signing.pub alone.
func TestVerifyOnlyKey(t *testing.T) {
	full, pubOnly := t.TempDir(), t.TempDir()
	c, err := loadCommon(slog.New(slog.DiscardHandler), full)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(full, auth.PubKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pubOnly, auth.PubKeyFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := loadVerifier(slog.New(slog.DiscardHandler), pubOnly)
	if err != nil {
		t.Fatal(err)
	}
	if v.signer != nil || !v.public.Equal(c.public) {
		t.Fatalf("verify-only load: signer %v, same key %v", v.signer, v.public.Equal(c.public))
	}
	if _, err := os.Stat(filepath.Join(pubOnly, auth.KeyFile)); err == nil {
		t.Error("a verify-only load created a private key")
	}
	if _, err := newFleetPart(v, fleetMock, 1, DefaultTenant, []string{"ws://127.0.0.1:1/v1/device/ws"}, nil, 1); err == nil {
		t.Error("simulated devices started without a signing key")
	}
}
