package bus

// okso's accounts on a NATS that admits its roles alone (DESIGN.md §6).
// The roles' clients are in AccountRoles, which has no JetStream; okso's
// buckets are in AccountState, which no client is in. JetStream sends
// what a client asks of it to a subject of the client's choosing, with
// no permission checked: a direct get's answer, headers and all, an API
// answer, a consumer's deliveries. With the buckets in an account of
// their own, whose API the roles reach through service imports, those
// answers go back into the asking client's account, never onto a
// bucket's subjects, and no client can create a consumer or a stream
// there: no role can have JetStream write a bucket it may not write.
const (
	AccountRoles = "OKSO"
	AccountState = "STATE"
)

// stateServices are the services AccountState exports to AccountRoles:
// reading streams (bindings, direct gets, a page at a time), keeping
// them (okso nats init and the admin's tools; the roles' permissions
// leave it out), and writing buckets' keys. No consumer: one would
// deliver where its creator says.
var stateServices = []struct {
	subject string
	stream  bool // several answers to one request
}{
	{jsAPI + "INFO", false},
	{jsAPI + "STREAM.INFO.*", false},
	{jsAPI + "STREAM.CREATE.*", false},
	{jsAPI + "STREAM.UPDATE.*", false},
	{jsAPI + "STREAM.DELETE.*", false},
	{jsAPI + "DIRECT.GET.>", true},
	{"$KV.>", false},
}

// AccountsConfig returns the accounts block of a nats-server
// configuration (the value of its "accounts" key) that admits okso's
// roles, each with the keys keys gives it and its permissions, as the
// server's configuration parser reads it: maps, slices and strings.
func AccountsConfig(keys func(Role) []string) map[string]any {
	var users []any
	for _, r := range Roles {
		for _, k := range keys(r) {
			u := map[string]any{"nkey": k}
			if p := r.Permissions(); p != nil {
				u["permissions"] = map[string]any{
					"publish":   map[string]any{"allow": anys(p.Publish.Allow)},
					"subscribe": map[string]any{"allow": anys(p.Subscribe.Allow)},
					"allow_responses": map[string]any{
						"max": p.Response.MaxMsgs, "expires": p.Response.Expires.String(),
					},
				}
			}
			users = append(users, u)
		}
	}
	roles := []any{AccountRoles}
	var exports, imports []any
	for _, s := range stateServices {
		e := map[string]any{"service": s.subject, "accounts": roles}
		if s.stream {
			e["response_type"] = "stream"
		}
		exports = append(exports, e)
		imports = append(imports, map[string]any{"service": map[string]any{"account": AccountState, "subject": s.subject}})
	}
	state := subjectPrefix + "state.>"
	exports = append(exports, map[string]any{"stream": state, "accounts": roles})
	imports = append(imports, map[string]any{"stream": map[string]any{"account": AccountState, "subject": state}})
	audit := subjectPrefix + "audit.>"
	return map[string]any{
		AccountRoles: map[string]any{
			"jetstream": "disabled",
			"users":     users,
			"imports":   imports,
			"exports":   []any{map[string]any{"stream": audit, "accounts": []any{AccountState}}},
		},
		AccountState: map[string]any{
			"jetstream": "enabled",
			"exports":   exports,
			"imports":   []any{map[string]any{"stream": map[string]any{"account": AccountRoles, "subject": audit}}},
		},
	}
}

func anys(s []string) []any {
	a := make([]any, len(s))
	for i, v := range s {
		a[i] = v
	}
	return a
}
