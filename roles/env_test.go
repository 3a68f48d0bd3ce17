package roles

import (
	"bytes"
	"strings"
	"testing"
)

// TestFlagsFromEnvironment: every flag can be set as OKSO_<FLAG>, and the
// command line wins over the environment.
func TestFlagsFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("OKSO_DATA_DIR", dir)
	t.Setenv("OKSO_TENANT", "from-env")
	var out bytes.Buffer
	root := NewRoot(&out, &out)
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
	root = NewRoot(&out, &out)
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
