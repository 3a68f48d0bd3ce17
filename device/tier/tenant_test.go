package tier_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// intruder is the tenant that presents node ids of [tiertest.Tenant] in
// these tests.
const intruder = "evil"

// tokenOf mints a device token for node in tenant ten.
func (tt *testTier) tokenOf(t testing.TB, node, ten string) string {
	t.Helper()
	return tt.Mint(t, auth.MintOptions{Subject: node, Tenant: ten,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
}

// wantOtherTenantRefused authenticates with token on the tier at url and
// checks the refusal: one E_SAFETY_DENIED error frame that does not name
// the owner's tenant, then 4403.
func wantOtherTenantRefused(t *testing.T, tt *testTier, url, token string) {
	t.Helper()
	rc := tt.dialURL(t, url, nil)
	rc.recv(t, wire.TypeHello, nil)
	rc.send(t, wire.TypeAuth, "", wire.Auth{Token: token})
	code, frames := rc.waitClose(t)
	if code != wire.CloseForbidden {
		t.Fatalf("close %d, want %d", code, wire.CloseForbidden)
	}
	if len(frames) != 1 || frames[0].Code != schemas.CodeSafetyDenied {
		t.Fatalf("error frames %+v, want one %s", frames, schemas.CodeSafetyDenied)
	}
	if strings.Contains(frames[0].Message, tiertest.Tenant) {
		t.Fatalf("error message %q names the owner's tenant", frames[0].Message)
	}
}

// TestNodeIDOfAnotherTenant: a device token of another tenant naming a
// node's id is refused with 4403 on every tier, while the node is up and
// after it left, and the owner never notices: same session, same record,
// calls answered. Each side's audit says what it may know. Only an
// operator who deletes the binding frees the node id.
func TestNodeIDOfAnotherTenant(t *testing.T) {
	tt := newTestTier(t, tier.Options{Name: "tier-a"})
	tt.Audit.KeepRaw()
	_, urlB := tt.StartReplica(t, tier.Options{Name: "tier-b"})
	owner := tt.runEcho(t)
	node := owner.node
	before := tt.Record(t, node)
	events := tt.watch(t)
	token := tt.tokenOf(t, node, intruder)

	for _, url := range []string{tt.URL, urlB} {
		wantOtherTenantRefused(t, tt, url, token)
	}
	if r := tt.Record(t, node); r == nil || r.SessionID != before.SessionID || r.Tenant != tiertest.Tenant {
		t.Fatalf("registry record %+v, want the owner's session %s untouched", r, before.SessionID)
	}
	select {
	case e := <-events:
		t.Fatalf("registry changed: %+v", e)
	default:
	}
	tt.Echo(t, node) // through the owner's one connection: its session lived on

	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionDenied && e.Tenant == intruder && e.NodeID == node && e.Code == schemas.CodeSafetyDenied
	})
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionDenied && e.Tenant == tiertest.Tenant && e.NodeID == node && e.Subject == ""
	})
	for _, e := range tt.Audit.Entries() {
		if e.Tenant == intruder && strings.Contains(e.Raw, tiertest.Tenant) {
			t.Errorf("the intruder's audit names the owner: %s", e.Raw)
		}
		if e.Tenant == tiertest.Tenant && strings.Contains(e.Raw, intruder) {
			t.Errorf("the owner's audit names the intruder: %s", e.Raw)
		}
	}

	// The owner leaves; its node id stays its tenant's.
	owner.leave(t)
	waitEvent(t, events, func(e bus.Event) bool { return leftEvent(e, node) })
	wantOtherTenantRefused(t, tt, urlB, token)

	// The operator frees the node id (nats kv del okso_node_tenants <id>):
	// the first tenant to come now owns it.
	js, err := jetstream.New(tt.NC)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), bus.BucketNodeTenants)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	rc := tt.dial(t, nil)
	if ok := rc.authenticate(t, token); ok.Tenant != intruder {
		t.Fatalf("auth_ok %+v, want tenant %s", ok, intruder)
	}
	rc.announce(t, node, echoCapability())
	wantOtherTenantRefused(t, tt, urlB, tt.Token(t, node))
}

// TestNodeIDRaceBetweenTenants: two tenants present one fresh node id on
// two tiers at the same moment: exactly one is accepted, the other gets
// 4403, every time.
func TestNodeIDRaceBetweenTenants(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	_, urlB := tt.StartReplica(t, tier.Options{})
	for round := range 10 {
		node := wire.NewNodeID()
		clients := []*rawClient{tt.dialURL(t, tt.URL, nil), tt.dialURL(t, urlB, nil)}
		tokens := []string{tt.Token(t, node), tt.tokenOf(t, node, intruder)}
		for _, rc := range clients {
			rc.recv(t, wire.TypeHello, nil)
		}
		outcomes := make([]string, len(clients))
		var wg sync.WaitGroup
		for i, rc := range clients {
			wg.Go(func() { outcomes[i] = authOutcome(t.Context(), rc, tokens[i]) })
		}
		wg.Wait()
		accepted, refused := 0, 0
		for _, o := range outcomes {
			switch o {
			case wire.TypeAuthOK:
				accepted++
			case strconv.Itoa(wire.CloseForbidden):
				refused++
			}
		}
		if accepted != 1 || refused != 1 {
			t.Fatalf("round %d: outcomes %v, want one auth_ok and one 4403", round, outcomes)
		}
		for _, rc := range clients {
			_ = rc.c.CloseNow()
		}
	}
}

// authOutcome sends auth with token on a client that has read hello and
// returns "auth_ok", the close code, or what else went wrong. It does not
// fail the test, so that goroutines may call it.
func authOutcome(ctx context.Context, rc *rawClient, token string) string {
	ctx, cancel := context.WithTimeout(ctx, tiertest.WaitFor)
	defer cancel()
	b, err := wire.Encode(wire.TypeAuth, "", wire.Auth{Token: token})
	if err != nil {
		return err.Error()
	}
	if err := rc.c.Write(ctx, websocket.MessageText, b); err != nil {
		return err.Error()
	}
	for {
		_, b, err := rc.c.Read(ctx)
		if err != nil {
			if code := websocket.CloseStatus(err); code != -1 {
				return strconv.Itoa(int(code))
			}
			return err.Error()
		}
		e, err := wire.DecodeEnvelope(rc.set, b)
		if err != nil {
			return err.Error()
		}
		if e.Type != wire.TypeError {
			return e.Type
		}
	}
}
