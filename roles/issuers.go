package roles

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"go.yaml.in/yaml/v3"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/internal/yamlconf"
	"github.com/okso-io/okso/schemas"
)

// issuersSchema is the $id of the --oauth-issuers file's contract.
const issuersSchema = schemas.IDPrefix + "oauth.issuers@1.0.0"

// issuerKeys are an issuer's keys, in the schema's order.
const issuerKeys = "name, issuer, audience, tenant, tenant_claim, tenants, scope_claim, scopes"

// loadIssuers reads the --oauth-issuers file at path.
func loadIssuers(path string) ([]auth.IssuerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--oauth-issuers: %w", err)
	}
	return parseIssuers(data, path)
}

// parseIssuers checks an issuers file against oauth.issuers@1.0.0, then
// what the schema cannot say: unique names and issuer URLs, and URLs okso
// will fetch keys from (https, or http to a loopback address). An error
// is one line naming the file, the line and the field, as in
// `issuers.yaml:4: issuers[0].tenants[1]: "a b" is not a tenant ...`.
func parseIssuers(data []byte, file string) ([]auth.IssuerConfig, error) {
	set, err := schemas.Load()
	if err != nil {
		return nil, fmt.Errorf("load the issuers schema: %w", err)
	}
	f := issuersForm()
	root, v, err := f.Checked(data, file, issuersSchema, func(v any) error { return set.Validate(issuersSchema, v) })
	if err != nil {
		return nil, err
	}
	var cfgs []auth.IssuerConfig
	names, urls := map[string]int{}, map[string]int{}
	for i, item := range v.(map[string]any)["issuers"].([]any) {
		m := item.(map[string]any)
		at := func(field ...string) []string { return append([]string{"issuers", strconv.Itoa(i)}, field...) }
		c := auth.IssuerConfig{
			Name:        m["name"].(string),
			Issuer:      m["issuer"].(string),
			Audience:    m["audience"].(string),
			Tenant:      str(m["tenant"]),
			TenantClaim: str(m["tenant_claim"]),
			ScopeClaim:  str(m["scope_claim"]),
		}
		for _, t := range list(m["tenants"]) {
			c.Tenants = append(c.Tenants, t.(string))
		}
		if sc, ok := m["scopes"].(map[string]any); ok {
			c.Scopes = map[string]string{}
			for k, v := range sc {
				c.Scopes[k] = v.(string)
			}
		}
		if j, dup := names[c.Name]; dup {
			return nil, f.ErrAt(file, root, at("name"), "%s is already the name of issuers[%d]", yamlconf.Quote(c.Name), j)
		}
		names[c.Name] = i
		if j, dup := urls[c.Issuer]; dup {
			return nil, f.ErrAt(file, root, at("issuer"), "already the issuer of issuers[%d]", j)
		}
		urls[c.Issuer] = i
		if c.Issuer == auth.Issuer {
			return nil, f.ErrAt(file, root, at("issuer"), "%q is okso's own issuer", auth.Issuer)
		}
		if err := auth.FetchableURL(c.Issuer); err != nil {
			return nil, f.ErrAt(file, root, at("issuer"), "not https (plain http only to a loopback address: keys fetched over it could be changed on the way)")
		}
		cfgs = append(cfgs, c)
	}
	return cfgs, nil
}

func str(v any) string { s, _ := v.(string); return s }

func list(v any) []any { l, _ := v.([]any); return l }

// issuersForm is the --oauth-issuers file's kind of file.
func issuersForm() *yamlconf.Form {
	return &yamlconf.Form{
		Empty: "want issuers: followed by a list",
		IsIndex: func(loc []string, i int) bool {
			if _, err := strconv.Atoi(loc[i]); err != nil {
				return false
			}
			return loc[i-1] == "issuers" && i == 1 || loc[i-1] == "tenants" && i == 3
		},
		Describe: describeIssuers,
	}
}

// describeIssuers words one broken rule of the issuers file.
func describeIssuers(root *yaml.Node, doc any, e *jsonschema.ValidationError) (field, at []string, msg string) {
	loc := e.InstanceLocation
	shown := func() string { return yamlconf.Shown(yamlconf.ValueAt(doc, loc), false) }
	last := ""
	if len(loc) > 0 {
		last = loc[len(loc)-1]
	}
	switch k := e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		at := append(slices.Clone(loc), yamlconf.FirstByLine(root, loc, k.Properties))
		switch {
		case len(loc) == 0:
			return at, at, "unknown key; the file has only issuers"
		case len(loc) == 2:
			return at, at, "unknown key; an issuer has " + issuerKeys
		case last == "scopes":
			return at, at, "not a scope name (empty, or a space or control character)"
		}
		return at, at, "unknown key"
	case *kind.Required:
		missing := k.Missing[0]
		at := append(slices.Clone(loc), missing)
		switch missing {
		case "issuers":
			return at, loc, "missing; the file lists the trusted issuers under issuers:"
		case "tenant_claim":
			return at, loc, "missing; give the tenant (one for every token), or tenant_claim and tenants (the claim that holds it, and the tenants allowed)"
		case "tenants":
			return at, loc, "missing; with tenant_claim, list the tenants this issuer may speak for"
		case "audience":
			return at, loc, "missing; what this issuer's tokens for okso carry in aud"
		}
		return at, loc, "missing"
	case *kind.Not:
		if last == "name" {
			return loc, loc, shown() + " is reserved: okso's own authorization server's subjects are oauth:<client>:<grant>"
		}
		return loc, loc, "not allowed here"
	case *kind.FalseSchema:
		return loc, loc, "not with tenant: the tenant is either fixed or read from a claim"
	case *kind.Pattern:
		switch {
		case strings.HasSuffix(e.SchemaURL, "/$defs/tenant"):
			return loc, loc, shown() + " is not a tenant (1 to 64 of A-Z, a-z, 0-9, _ and -)"
		case last == "name":
			return loc, loc, shown() + " is not an issuer name: a lower-case letter, then up to 31 of a-z, 0-9, _ and -"
		case last == "issuer":
			return loc, loc, "not an http:// or https:// URL"
		}
		return loc, loc, "holds a control character"
	case *kind.MinItems:
		if last == "tenants" {
			return loc, loc, "empty; list the tenants this issuer may speak for"
		}
		return loc, loc, "empty; list the trusted issuers"
	}
	if msg, ok := yamlconf.Plain(e, shown()); ok {
		return loc, loc, msg
	}
	return loc, loc, "fails " + strings.Join(e.ErrorKind.KeywordPath(), "/") + " of " + issuersSchema
}
