package roles

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/okso-io/okso/auth"
)

// readmeIssuers is the README's example of --oauth-issuers (Sign in
// with OAuth), which must stay a valid file.
func readmeIssuers(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```yaml\n# issuers.yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("the README has no ```yaml block starting # issuers.yaml")
	}
	return "# issuers.yaml\n" + example // as the README shows it, for its lines
}

func TestParseIssuers(t *testing.T) {
	got, err := parseIssuers([]byte(readmeIssuers(t)), "issuers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []auth.IssuerConfig{
		{Name: "kc", Issuer: "https://sso.example.com/realms/acme", Audience: "okso", TenantClaim: "okso_tenant",
			Tenants: []string{"acme", "globex"}, Scopes: map[string]string{"okso:read": auth.ScopeReadOnly, "okso:write": auth.ScopeMutating}},
		{Name: "entra", Issuer: "https://login.microsoftonline.com/00000000-0000-0000-0000-000000000000/v2.0", Audience: "api://okso",
			Tenant: "acme", ScopeClaim: "scp", Scopes: map[string]string{"Tools.Read": auth.ScopeReadOnly}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	// The README's example of an error.
	bad := strings.Replace(readmeIssuers(t), "tenants: [acme, globex]", `tenants: [acme, "a b"]`, 1)
	const msg = `issuers.yaml:7: issuers[0].tenants[1]: "a b" is not a tenant (1 to 64 of A-Z, a-z, 0-9, _ and -)`
	if _, err := parseIssuers([]byte(bad), "issuers.yaml"); err == nil || err.Error() != msg {
		t.Errorf("README's error example: got %v, want %s", err, msg)
	}
}

func TestParseIssuersErrors(t *testing.T) {
	const head = "issuers:\n  - name: kc\n    issuer: https://sso.example.com\n    audience: okso\n"
	for _, tc := range []struct{ name, file, want string }{
		{"empty", "", "f.yaml: the file is empty; want issuers: followed by a list"},
		{"not yaml", "issuers: [\n  - name: kc\n", "f.yaml:2: not YAML: did not find expected node content"},
		{"no tenant", head, "f.yaml:2: issuers[0].tenant_claim: missing; give the tenant (one for every token), or tenant_claim and tenants (the claim that holds it, and the tenants allowed)"},
		{"both", head + "    tenant: acme\n    tenant_claim: org\n", "f.yaml:6: issuers[0].tenant_claim: not with tenant: the tenant is either fixed or read from a claim"},
		{"bad tenant", head + "    tenant_claim: org\n    tenants: [acme, \"a b\"]\n", `f.yaml:6: issuers[0].tenants[1]: "a b" is not a tenant (1 to 64 of A-Z, a-z, 0-9, _ and -)`},
		{"bad scope", head + "    tenant: acme\n    scopes:\n      read: tools:call:everything\n", `f.yaml:7: issuers[0].scopes.read: "tools:call:everything" is not one of tools:call:read_only, tools:call:mutating, tools:call:destructive`},
		{"unknown key", head + "    tenant: acme\n    jwks_uri: https://x\n", "f.yaml:6: issuers[0].jwks_uri: unknown key; an issuer has " + issuerKeys},
		{"plain http", "issuers:\n  - name: kc\n    issuer: http://sso.example.com\n    audience: okso\n    tenant: acme\n",
			"f.yaml:3: issuers[0].issuer: not https (plain http only to a loopback address: keys fetched over it could be changed on the way)"},
		{"twice", head + "    tenant: acme\n  - name: kc\n    issuer: https://other.example.com\n    audience: okso\n    tenant: acme\n",
			`f.yaml:6: issuers[1].name: "kc" is already the name of issuers[0]`},
		{"same issuer", head + "    tenant: acme\n  - name: kc2\n    issuer: https://sso.example.com\n    audience: okso\n    tenant: acme\n",
			`f.yaml:7: issuers[1].issuer: already the issuer of issuers[0]`},
		{"reserved name", "issuers:\n  - name: oauth\n    issuer: https://sso.example.com\n    audience: okso\n    tenant: acme\n",
			`f.yaml:2: issuers[0].name: "oauth" is reserved: okso's own authorization server's subjects are oauth:<client>:<grant>`},
		{"duplicate key", head + "    tenant: acme\n    tenant: globex\n", "f.yaml:6: issuers[0].tenant: given twice, first at line 5"},
		{"loopback http", "issuers:\n  - name: dev\n    issuer: http://127.0.0.1:8080\n    audience: okso\n    tenant: demo\n    tenant: demo\n",
			"f.yaml:6: issuers[0].tenant: given twice, first at line 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseIssuers([]byte(tc.file), "f.yaml")
			if err == nil || err.Error() != tc.want {
				t.Fatalf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
}

// TestOAuthIssuersUnreachable: a gateway whose issuer cannot be
// discovered does not start, and says which issuer and why.
func TestOAuthIssuersUnreachable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "issuers.yaml")
	conf := "issuers:\n  - name: kc\n    issuer: http://127.0.0.1:1/realms/acme\n    audience: okso\n    tenant: demo\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := AllInOneConfig{
		Gateway: gatewayConfig{Addr: "127.0.0.1:0", OAuthIssuers: file},
		Tier:    tierConfig{Addr: "127.0.0.1:0"},
		DataDir: t.TempDir(),
		Tenant:  DefaultTenant,
	}
	a, err := NewAllInOne(t.Context(), slog.New(slog.DiscardHandler), cfg)
	if err == nil {
		a.close()
		t.Fatal("all-in-one started with an issuer it cannot reach")
	}
	if want := "--oauth-issuers " + file + ": issuer kc: discovery:"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q; want it to say %q", err, want)
	}
}
