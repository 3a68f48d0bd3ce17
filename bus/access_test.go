package bus_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// TestRolesOnNATS: on a NATS server that admits okso's roles (embedded,
// or an external one configured by okso nats server-config), a client
// without a credential of theirs cannot connect, and each role can do
// what its part of okso does and nothing that would let it act as
// another: forge a registry record, delete a revocation, serve or call a
// node as the wrong role, read the audit or another role's answers.
func TestRolesOnNATS(t *testing.T) {
	creds, err := bus.NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	seeds := t.TempDir()
	for _, r := range bus.Roles {
		b, err := creds.SeedFile(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(seeds, bus.SeedFileName(r)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("embedded", func(t *testing.T) {
		srv, err := bus.StartServer(bus.ServerOptions{Listen: "127.0.0.1:0", Credentials: creds})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		checkRoles(t, srv.ClientURL(), seeds)
	})
	t.Run("server-config", func(t *testing.T) {
		conf, err := creds.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		checkRoles(t, startConfigured(t, conf), seeds)
	})
}

// startConfigured starts a nats-server from a configuration file holding
// auth (okso nats server-config) and returns its client URL.
func startConfigured(t *testing.T, auth string) string {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	text := "listen: 127.0.0.1:-1\njetstream: {store_dir: " + `"` + filepath.Join(dir, "js") + `"` + "}\n" + auth
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the server configuration does not load: %v\n%s", err, text)
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return ns.ClientURL()
}

// roleConn is a connection of one role, and the permission violations
// NATS reported to it.
type roleConn struct {
	*nats.Conn
	denied chan error
}

func connectRole(t *testing.T, url, seeds string, role bus.Role) *roleConn {
	t.Helper()
	nc, err := bus.ConnectURL(url, "test-"+string(role), bus.ClientOptions{Role: role, NkeyFile: filepath.Join(seeds, bus.SeedFileName(role))})
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	c := &roleConn{Conn: nc, denied: make(chan error, 64)}
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			c.denied <- err
		}
	})
	return c
}

// refused runs do, which must be refused by NATS for want of permission
// on subject.
func (c *roleConn) refused(t *testing.T, subject string, do func() error) {
	t.Helper()
	if err := do(); err != nil && !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("%s: %v", subject, err)
	}
	select {
	case err := <-c.denied:
		if !strings.Contains(err.Error(), `"`+subject+`"`) {
			t.Fatalf("%s: refused, but for another subject: %v", subject, err)
		}
	case <-time.After(eventTimeout):
		t.Fatalf("%s %s: not refused", c.Opts.Name, subject)
	}
}

func (c *roleConn) mayNotPublish(t *testing.T, subject string, hdr nats.Header) {
	t.Helper()
	c.refused(t, subject, func() error { return c.PublishMsg(&nats.Msg{Subject: subject, Header: hdr, Data: []byte("{}")}) })
}

func (c *roleConn) mayNotSubscribe(t *testing.T, subject string) {
	t.Helper()
	c.refused(t, subject, func() error {
		_, err := c.SubscribeSync(subject)
		return err
	})
}

func checkRoles(t *testing.T, url string, seeds string) {
	ctx, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()

	for _, opts := range []bus.ClientOptions{
		{},
		{NkeyFile: writeSeed(t, mustUserKey(t))}, // a key nobody gave a role
	} {
		if nc, err := bus.ConnectURL(url, "stranger", opts); err == nil {
			nc.Close()
			t.Fatalf("connected with %+v", opts)
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("connect with %+v: %v, want an authorization violation", opts, err)
		}
	}

	gw := connectRole(t, url, seeds, bus.RoleGateway)
	dev := connectRole(t, url, seeds, bus.RoleDevice)
	rem := connectRole(t, url, seeds, bus.RoleRemote)
	audit := connectRole(t, url, seeds, bus.RoleAudit)
	admin := connectRole(t, url, seeds, bus.RoleAdmin)

	// What each role does, once the admin has made okso's buckets: the
	// device tier writes the registry, the admin revokes.
	if err := bus.InitState(ctx, admin.Conn, bus.StateOptions{AuditRetention: time.Hour}); err != nil {
		t.Fatalf("admin makes the buckets: %v", err)
	}
	greg, err := bus.OpenRegistry(ctx, gw.Conn, bus.RegistryOptions{BindOnly: true})
	if err != nil {
		t.Fatalf("gateway opens the registry: %v", err)
	}
	if _, err := bus.OpenRevocations(ctx, gw.Conn, bus.RevocationOptions{ReadOnly: true}); err != nil {
		t.Fatalf("gateway opens the revocations: %v", err)
	}
	callers, err := bus.OpenCallers(ctx, gw.Conn, bus.CallersOptions{BindOnly: true})
	if err != nil {
		t.Fatalf("gateway opens its callers: %v", err)
	}
	if err := bus.KeepAudit(ctx, gw.Conn, time.Hour, 1, false, true); err != nil {
		t.Fatalf("gateway finds the audit stream: %v", err)
	}
	reg, err := bus.OpenRegistry(ctx, dev.Conn, bus.RegistryOptions{BindOnly: true})
	if err != nil {
		t.Fatalf("device tier opens the registry: %v", err)
	}
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	tl, err := reg.HoldTier(ctx, "tier-a")
	if err != nil {
		t.Fatalf("device tier holds its lease: %v", err)
	}
	if _, err := tl.Refresh(ctx); err != nil {
		t.Fatalf("device tier refreshes its lease: %v", err)
	}
	if _, err := tl.Claim(ctx, bus.Node{NodeID: node, Tenant: "demo", SessionID: "s1"}); err != nil {
		t.Fatalf("device tier claims a node: %v", err)
	}
	// The gateway follows the nodes and the tiers' leases.
	if ev := watch(t, greg).nextFor(t, node); ev.Node == nil || ev.Node.Offline() {
		t.Fatalf("the gateway sees the tier's node as %+v, want online", ev.Node)
	}
	bindings, err := bus.OpenBindings(ctx, dev.Conn, bus.BindingsOptions{BindOnly: true})
	if err != nil {
		t.Fatalf("device tier opens the bindings: %v", err)
	}
	if _, err := bus.OpenRemotes(ctx, rem.Conn, bus.RemotesOptions{BindOnly: true}); err != nil {
		t.Fatalf("remote tier opens the remotes: %v", err)
	}
	revs, err := bus.OpenRevocations(ctx, admin.Conn, bus.RevocationOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := revs.Revoke(ctx, "jti-1", time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("admin revokes: %v", err)
	}
	// A record of the gateway's own bucket, which it may write, shaped to
	// delete what it would land on.
	del := nats.NewMsg("$KV." + bus.BucketCallers + ".trap")
	del.Header.Set("KV-Operation", "DEL")
	del.Data = []byte("trap")
	gjs, err := jetstream.New(gw.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gjs.PublishMsg(ctx, del); err != nil {
		t.Fatalf("gateway writes its callers: %v", err)
	}
	// Gateways claim caller ids in okso_callers, through the state
	// account's services: created where none is, taken over by a
	// compare-and-set, refreshed and released only while their own.
	gw2 := connectRole(t, url, seeds, bus.RoleGateway)
	callers2, err := bus.OpenCallers(ctx, gw2.Conn, bus.CallersOptions{BindOnly: true})
	if err != nil {
		t.Fatalf("second gateway opens its callers: %v", err)
	}
	held, err := callers.Claim(ctx, bus.CallerClaim{ListenID: "l1", Tenant: "demo", Subject: "agent-a", CallerID: "a"})
	if err != nil {
		t.Fatalf("gateway claims a caller id: %v", err)
	}
	if _, err := callers2.Claim(ctx, bus.CallerClaim{ListenID: "x1", Tenant: "demo", Subject: "agent-x", CallerID: "a"}); !errors.Is(err, bus.ErrCallerHeld) {
		t.Fatalf("another agent's claim on another gateway: %v, want ErrCallerHeld", err)
	}
	taken, err := callers2.Claim(ctx, bus.CallerClaim{ListenID: "l2", Tenant: "demo", Subject: "agent-a", CallerID: "a"})
	if err != nil || taken.Replaced() != "l1" {
		t.Fatalf("the same agent's claim on another gateway: %v, want l1 taken over", err)
	}
	if err := held.Refresh(ctx); !errors.Is(err, bus.ErrClaimLost) {
		t.Fatalf("the replaced claim's refresh: %v, want ErrClaimLost", err)
	}
	if err := taken.Refresh(ctx); err != nil {
		t.Fatalf("gateway refreshes its claim: %v", err)
	}
	if err := taken.Release(ctx); err != nil {
		t.Fatalf("gateway releases its claim: %v", err)
	}
	if cl, err := callers.ClaimOf(ctx, "demo", "a"); err != nil || cl != nil {
		t.Fatalf("the released claim: %+v, %v", cl, err)
	}

	// A call: the gateway asks, the tier serving the node answers once.
	var served atomic.Int32
	if _, err := dev.QueueSubscribe(bus.NodeCmd(node), bus.QueueNode, func(m *nats.Msg) {
		served.Add(1)
		_ = m.Respond([]byte("ok"))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := rem.QueueSubscribe(bus.RemoteCall("ext"), bus.QueueRemote, func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*roleConn{dev, rem} {
		if err := c.Flush(); err != nil { // the server has the subscription
			t.Fatal(err)
		}
	}
	for _, subject := range []string{bus.NodeCmd(node), bus.RemoteCall("ext")} {
		if m, err := gw.RequestWithContext(ctx, subject, []byte("{}")); err != nil || string(m.Data) != "ok" {
			t.Fatalf("gateway calls %s: %v", subject, err)
		}
	}
	if n := served.Load(); n != 1 {
		t.Fatalf("the node served %d calls, want 1", n)
	}

	// The audit: published by the roles, kept in the audit stream, read
	// back by the audit role alone.
	if err := gw.Publish(bus.Audit("demo"), []byte(`{"decision":"allowed"}`)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(eventTimeout)
	for {
		m, err := audit.Request("$JS.API.DIRECT.GET."+bus.StreamAudit, []byte(`{"last_by_subj":"okso.v1.audit.demo"}`), eventTimeout)
		if err == nil && string(m.Data) == `{"decision":"allowed"}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit stream does not keep the gateway's event: %v", err)
		}
		<-time.After(20 * time.Millisecond)
	}

	t.Run("gateway", func(t *testing.T) {
		// The dashboard's live audit feed: a tenant's subject as events
		// come (the gateway keeps each tenant to its own, as it does its
		// calls), never the stream's stored events.
		feed, err := gw.SubscribeSync(bus.Audit("demo"))
		if err != nil {
			t.Fatal(err)
		}
		if err := gw.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := dev.Publish(bus.Audit("demo"), []byte(`{"decision":"connected"}`)); err != nil {
			t.Fatal(err)
		}
		if m, err := feed.NextMsg(eventTimeout); err != nil || string(m.Data) != `{"decision":"connected"}` {
			t.Fatalf("the gateway follows a tenant's audit subject: %v %v", m, err)
		}
		_ = feed.Unsubscribe()
		gw.mayNotPublish(t, "$JS.API.DIRECT.GET."+bus.StreamAudit, nil)
		gw.mayNotSubscribe(t, "_INBOX.device.>")
		gw.mayNotPublish(t, "$KV."+bus.BucketNodes+"."+node, nil)
		gw.mayNotPublish(t, "$KV."+bus.BucketTiers+".tier-a", nil)
		gw.mayNotPublish(t, bus.Stream("s1"), nil)
	})
	t.Run("device", func(t *testing.T) {
		// A device tier cannot call a node as a gateway would.
		dev.refused(t, bus.NodeCmd(node), func() error {
			_, err := dev.Request(bus.NodeCmd(node), []byte("{}"), 200*time.Millisecond)
			if errors.Is(err, nats.ErrTimeout) { // it went nowhere
				return nil
			}
			return err
		})
		dev.mayNotPublish(t, bus.RemoteCall("ext"), nil)
		dev.mayNotSubscribe(t, "okso.v1.caller.>")
		dev.mayNotSubscribe(t, bus.Stream("*"))
		dev.mayNotSubscribe(t, "_INBOX.gateway.>")
		dev.mayNotPublish(t, "$KV."+bus.BucketRemotes+".ext", nil)
		dev.mayNotPublish(t, "$KV."+bus.BucketPlans+".p1", nil) // a plan is a gateway's
	})
	t.Run("remote", func(t *testing.T) {
		rem.mayNotSubscribe(t, bus.NodeCmd("*"))
		rem.mayNotPublish(t, bus.NodeCmd(node), nil)
		rem.mayNotPublish(t, "$KV."+bus.BucketNodes+"."+node, nil)
		rem.mayNotPublish(t, "$KV."+bus.BucketTiers+".tier-a", nil)
		rem.mayNotPublish(t, "$KV."+bus.BucketPlans+".p1", nil)
		rem.mayNotSubscribe(t, ">")
	})
	// No role but the admin may forge a revocation or take one back, by
	// writing the key, purging or deleting the bucket's stream or one of
	// its messages, or changing the stream's limits.
	t.Run("revocations", func(t *testing.T) {
		stream := "KV_" + bus.BucketRevoked
		for _, c := range []*roleConn{gw, dev, rem} {
			c.mayNotPublish(t, "$KV."+bus.BucketRevoked+".jti-1", nats.Header{"KV-Operation": {"DEL"}})
			c.mayNotPublish(t, "$KV."+bus.BucketRevoked+".jti-2", nil)
			for _, api := range []string{"STREAM.PURGE.", "STREAM.DELETE.", "STREAM.MSG.DELETE.", "STREAM.UPDATE."} {
				c.mayNotPublish(t, "$JS.API."+api+stream, nil)
			}
		}
	})
	// Only the admin registers kinds; gateways and tiers read them.
	t.Run("kinds", func(t *testing.T) {
		set := loadSet(t)
		akinds, err := bus.OpenKinds(ctx, admin.Conn, bus.KindsOptions{Schemas: set})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := akinds.Apply(ctx, thermoDef(t, set)); err != nil {
			t.Fatalf("admin applies a kind: %v", err)
		}
		for _, c := range []*roleConn{gw, dev} {
			k, err := bus.OpenKinds(ctx, c.Conn, bus.KindsOptions{Schemas: set, BindOnly: true})
			if err != nil {
				t.Fatalf("%s opens the kinds: %v", c.Opts.Name, err)
			}
			if kt, err := k.Table(ctx); err != nil || len(kt.Defs()) != 1 {
				t.Fatalf("%s reads the kinds: %v", c.Opts.Name, err)
			}
		}
		for _, c := range []*roleConn{gw, dev, rem} {
			c.mayNotPublish(t, "$KV."+bus.BucketKinds+".acme.thermo.v1", nil)
			c.mayNotPublish(t, "$KV."+bus.BucketKinds+".acme.other.v1", nil)
			c.mayNotPublish(t, "$JS.API.STREAM.PURGE.KV_"+bus.BucketKinds, nil)
		}
	})
	// JetStream answers where the asker says, unchecked by permissions:
	// a direct get's answer (the stored message, headers and all) or an
	// API answer sent onto a bucket's subject, or onto JetStream's own
	// API, must write nothing.
	devRevs, err := bus.OpenRevocations(ctx, dev.Conn, bus.RevocationOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	revoked := make(chan string, 16)
	loaded := make(chan struct{}, 1)
	rctx, stopRevs := context.WithCancel(ctx)
	defer stopRevs()
	go func() {
		_ = devRevs.Run(rctx, func() {
			select {
			case loaded <- struct{}{}:
			default:
			}
		}, func(jti string) { revoked <- jti })
	}()
	select {
	case <-loaded:
	case <-time.After(eventTimeout):
		t.Fatal("the device tier's revocations never loaded")
	}
	t.Run("reflections", func(t *testing.T) {
		trap := "$JS.API.DIRECT.GET.KV_" + bus.BucketCallers + ".$KV." + bus.BucketCallers + ".trap"
		for _, reply := range []string{
			"$KV." + bus.BucketRevoked + ".jti-1",                    // a deletion of the revocation
			"$KV." + bus.BucketRevoked + ".jti-3",                    // a revocation nobody made
			"$KV." + bus.BucketNodes + ".01hzx9k3m4p7q8r9s0t1v2w3xz", // a forged node
			"$JS.API.STREAM.DELETE.KV_" + bus.BucketRevoked,          // the revocations' end
			"$JS.API.STREAM.PURGE.KV_" + bus.BucketRevoked,
		} {
			if err := gw.PublishRequest(trap, reply, nil); err != nil {
				t.Fatal(err)
			}
		}
		// Onto a bucket's state subject, which the buckets' followers
		// read: a stored message whose own headers claim to be the
		// revocation's deletion, far ahead.
		spoof := nats.NewMsg("$KV." + bus.BucketCallers + ".spoof")
		spoof.Header.Set("KV-Operation", "DEL")
		spoof.Header.Set("Nats-Stream", "KV_"+bus.BucketRevoked)
		spoof.Header.Set("Nats-Subject", "$KV."+bus.BucketRevoked+".jti-1")
		spoof.Header.Set("Nats-Sequence", "999999")
		ajs, err := jetstream.New(admin.Conn)
		if err != nil {
			t.Fatal(err)
		}
		akv, err := ajs.KeyValue(ctx, bus.BucketRevoked)
		if err != nil {
			t.Fatal(err)
		}
		e, err := akv.Get(ctx, "jti-1")
		if err != nil {
			t.Fatal(err)
		}
		spoof.Header.Set("Nats-Last-Sequence", strconv.FormatUint(e.Revision(), 10)) // it follows the real one
		if _, err := gjs.PublishMsg(ctx, spoof); err != nil {
			t.Fatal(err)
		}
		if err := gw.PublishRequest("$JS.API.DIRECT.GET.KV_"+bus.BucketCallers+".$KV."+bus.BucketCallers+".spoof",
			"okso.v1.state."+bus.BucketRevoked+".jti-1", nil); err != nil {
			t.Fatal(err)
		}
		// The audit role's one API, answered onto a node's binding.
		if err := audit.PublishRequest("$JS.API.STREAM.INFO."+bus.StreamAudit, "$KV."+bus.BucketNodeTenants+".node7", nil); err != nil {
			t.Fatal(err)
		}
		// The same direct get answered where it may go comes after those
		// (one stream's direct gets are answered in turn), and a stream's
		// info after the audit role's (so are API requests).
		if m, err := gw.Request(trap, nil, eventTimeout); err != nil || string(m.Data) != "trap" {
			t.Fatalf("the trap, read back: %v", err)
		}
		if _, err := gjs.Stream(ctx, "KV_"+bus.BucketCallers); err != nil {
			t.Fatal(err)
		}
		if b, _, err := bindings.Bind(ctx, "node7", "demo"); err != nil {
			t.Errorf("a node's binding after the audit role's reflection: %v %v", b, err)
		}
		// A revocation made after the reflections reaches the device
		// tier's follower after them; jti-1 is still revoked there.
		if err := revs.Revoke(ctx, "jti-4", time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		for jti := ""; jti != "jti-4"; {
			select {
			case jti = <-revoked:
			case <-time.After(eventTimeout):
				t.Fatal("the device tier never saw jti-4 revoked")
			}
		}
		if !devRevs.Revoked("jti-1") {
			t.Error("the device tier's follower took a reflected message for jti-1's deletion")
		}
	})
	// Nor may a role create a stream (to capture other roles' subjects) or
	// a consumer (to deliver a bucket's messages where it says).
	gw.mayNotPublish(t, "$JS.API.STREAM.CREATE.capture", nil)
	dev.mayNotPublish(t, "$JS.API.CONSUMER.CREATE.KV_"+bus.BucketNodes, nil)
	rem.mayNotPublish(t, "$JS.API.CONSUMER.CREATE.KV_"+bus.BucketRemotes+".c.$KV."+bus.BucketRemotes+".>", nil)
	audit.mayNotPublish(t, "$JS.API.STREAM.UPDATE."+bus.StreamAudit, nil)
	if n := served.Load(); n != 1 {
		t.Fatalf("the node served %d calls, want 1: a refused request reached it", n)
	}

	// The admin sees the records as their writers left them.
	js, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, bus.BucketRevoked)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "jti-1"); err != nil {
		t.Fatalf("the revocation: %v", err)
	}
	for _, jti := range []string{"jti-2", "jti-3"} {
		if _, err := kv.Get(ctx, jti); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("a revocation nobody made: %s: %v", jti, err)
		}
	}
	n, err := reg.Get(ctx, node)
	if err != nil || n == nil || n.SessionID != "s1" {
		t.Fatalf("the node's record: %+v, %v", n, err)
	}
	if n, err := reg.Get(ctx, "01hzx9k3m4p7q8r9s0t1v2w3xz"); n != nil || err != nil {
		t.Fatalf("a node nobody claimed: %+v, %v", n, err)
	}
}

func mustUserKey(t *testing.T) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func writeSeed(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "stranger.nk")
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestClusterRoutes: the embedded servers of one cluster route to each
// other over TLS with their shared route secret; a member with another
// secret, or one that does not trust the others' certificate, is
// refused, and the refusal is logged, not silent.
func TestClusterRoutes(t *testing.T) {
	creds, err := bus.NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	strangers, err := bus.NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	trusting := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	distrusting := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12} // the system's roots
	var routes []string
	for range 4 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, ln.Addr().String())
		ln.Close()
	}
	// member i routes to member to.
	member := func(i, to int, c *bus.Credentials, conf *tls.Config) (*bus.Server, *syncBuffer) {
		t.Helper()
		logs := &syncBuffer{}
		srv, err := bus.StartServer(bus.ServerOptions{Name: fmt.Sprintf("n%d", i), Listen: "127.0.0.1:0",
			Credentials: c, TLS: conf, Log: slog.New(slog.NewJSONHandler(logs, nil)),
			Cluster: bus.ClusterOptions{Name: "okso", Listen: routes[i], Routes: []string{"nats-route://" + routes[to]}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		return srv, logs
	}
	a, aLog := member(0, 1, creds, trusting)
	b, _ := member(1, 0, creds, trusting)

	// A message published on a reaches a subscriber on b: they route.
	sub, err := b.ConnectAs(bus.RoleGateway, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got, err := sub.SubscribeSync(bus.Stream("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	pub, err := a.ConnectAs(bus.RoleDevice, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	deadline := time.Now().Add(eventTimeout)
	for {
		if err := pub.Publish(bus.Stream("s1"), []byte("frame")); err != nil {
			t.Fatal(err)
		}
		if _, err := got.NextMsg(100 * time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the two members never routed")
		}
	}

	_, cLog := member(2, 0, strangers, trusting)
	_, dLog := member(3, 0, creds, distrusting)
	refused := func(logs ...*syncBuffer) bool {
		for _, l := range logs {
			if strings.Contains(l.String(), "nats route refused") {
				return true
			}
		}
		return false
	}
	for !refused(aLog, cLog) || !refused(dLog) {
		if time.Now().After(deadline.Add(eventTimeout)) {
			t.Fatalf("a member with another secret, or distrusting the certificate, not refused in the logs:\na: %s\nc: %s\nd: %s",
				aLog, cLog, dLog)
		}
		<-time.After(50 * time.Millisecond)
	}
	if !strings.Contains(dLog.String(), "certificate") {
		t.Errorf("the distrusting member's refusal does not name the certificate: %s", dLog)
	}
}

// TestRotateCredential: after a role's credential is rotated, a server
// that loads the credentials admits both the old seed and the new, each
// with the role's permissions and no more; once the retired key is
// deleted, the old seed is refused.
func TestRotateCredential(t *testing.T) {
	dir := t.TempDir()
	old, err := bus.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	oldSeed, err := old.SeedFile(bus.RoleGateway)
	if err != nil {
		t.Fatal(err)
	}
	seeds := t.TempDir()
	if err := os.WriteFile(filepath.Join(seeds, bus.SeedFileName(bus.RoleGateway)), oldSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := bus.RotateCredential(dir, bus.RoleGateway)
	if err != nil {
		t.Fatal(err)
	}
	if pub == old.PublicKey(bus.RoleGateway) {
		t.Fatal("the rotated key is the old one")
	}
	serve := func() string {
		t.Helper()
		c, err := bus.LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		if c.PublicKey(bus.RoleGateway) != pub || c.PublicKey(bus.RoleDevice) != old.PublicKey(bus.RoleDevice) {
			t.Fatal("the data dir's keys are not the rotated gateway's and the same device's")
		}
		srv, err := bus.StartServer(bus.ServerOptions{Listen: "127.0.0.1:0", Credentials: c})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		return srv.ClientURL()
	}
	url := serve()
	for _, seedDir := range []string{seeds, dir} {
		c := connectRole(t, url, seedDir, bus.RoleGateway)
		c.mayNotSubscribe(t, bus.NodeCmd("*"))
	}

	if err := os.RemoveAll(filepath.Join(dir, "retired")); err != nil {
		t.Fatal(err)
	}
	url = serve()
	connectRole(t, url, dir, bus.RoleGateway)
	_, err = bus.ConnectURL(url, "old", bus.ClientOptions{Role: bus.RoleGateway, NkeyFile: filepath.Join(seeds, bus.SeedFileName(bus.RoleGateway))})
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Fatalf("the old seed once its key is deleted: %v, want an authorization violation", err)
	}
}

// TestCredentialsOwnerOnly: a seed or the route secret that others than
// its owner may read is refused, saying how to mend it.
func TestCredentialsOwnerOnly(t *testing.T) {
	for _, file := range []string{bus.SeedFileName(bus.RoleDevice), "route.secret"} {
		dir := t.TempDir()
		if _, err := bus.LoadCredentials(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, file), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := bus.LoadCredentials(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("%s readable by all: %v, want a refusal saying chmod 600", file, err)
		}
	}
}

// TestUpgradeMovesState: an okso that starts with credentials on a store
// where an older okso (without them) kept its buckets in NATS's global
// account moves the revocations and the node bindings into okso's
// accounts, and the old buckets go.
func TestUpgradeMovesState(t *testing.T) {
	store := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), eventTimeout)
	defer cancel()

	old, err := bus.StartServer(bus.ServerOptions{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := old.Connect("older okso")
	if err != nil {
		t.Fatal(err)
	}
	revs, err := bus.OpenRevocations(ctx, nc, bus.RevocationOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := revs.Revoke(ctx, "jti-old", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	bindings, err := bus.OpenBindings(ctx, nc, bus.BindingsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bindings.Bind(ctx, "01hzx9k3m4p7q8r9s0t1v2w3xy", "acme"); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	old.Shutdown()

	creds, err := bus.NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	start := func() *bus.Server {
		t.Helper()
		srv, err := bus.StartServer(bus.ServerOptions{StoreDir: store, Credentials: creds})
		if err != nil {
			t.Fatal(err)
		}
		admin, err := srv.ConnectAs(bus.RoleAdmin, "admin")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(admin.Close)
		if err := bus.InitState(ctx, admin, bus.StateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restore(ctx, admin); err != nil {
			t.Fatalf("restore: %v", err)
		}
		return srv
	}
	srv := start()
	dev, err := srv.ConnectAs(bus.RoleDevice, "device tier")
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	check := func() {
		t.Helper()
		r, err := bus.OpenRevocations(ctx, dev, bus.RevocationOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		loaded := make(chan struct{})
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = r.Run(rctx, func() { close(loaded) }, nil) }()
		<-loaded
		if !r.Revoked("jti-old") {
			t.Error("the older okso's revocation was lost")
		}
		b, err := bus.OpenBindings(ctx, dev, bus.BindingsOptions{BindOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if owner, _, err := b.Bind(ctx, "01hzx9k3m4p7q8r9s0t1v2w3xy", "intruder"); !errors.Is(err, bus.ErrOtherTenant) || owner != "acme" {
			t.Errorf("the older okso's binding: %q, %v, want acme's", owner, err)
		}
	}
	check()
	if _, err := os.Stat(filepath.Join(store, "jetstream", "$G", "streams", "KV_"+bus.BucketRevoked)); !os.IsNotExist(err) {
		t.Errorf("the older okso's bucket is still there: %v", err)
	}
	dev.Close()
	srv.Shutdown()

	// Started again: nothing to move, nothing lost.
	srv = start()
	defer srv.Shutdown()
	if dev, err = srv.ConnectAs(bus.RoleDevice, "device tier"); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	check()
}

// TestFromRole: a request is a role's when its reply subject is one of
// that role's, and only then.
func TestFromRole(t *testing.T) {
	for reply, want := range map[string]bool{
		"_INBOX.gateway.abc.1": true,
		"_INBOX.gateway.":      false,
		"_INBOX.gateway":       false,
		"_INBOX.gatewayx.abc":  false,
		"_INBOX.device.abc.1":  false,
		"_INBOX.abc.1":         false,
		"":                     false,
	} {
		if got := bus.FromRole(&nats.Msg{Reply: reply}, bus.RoleGateway, bus.RoleAdmin); got != want {
			t.Errorf("FromRole(%q) = %v, want %v", reply, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { bus.FromRole(&nats.Msg{Reply: "_INBOX.remote.x.1"}, bus.RoleGateway, bus.RoleRemote) }); n != 0 {
		t.Errorf("FromRole allocates %v times", n)
	}
}
