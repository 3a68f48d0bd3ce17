package tier_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestProtocolFailures breaks the protocol in one way per case, from a raw
// client, and checks the close code, the error frame before it, the audit
// event, and that a well-behaved device on the same tier keeps working.
func TestProtocolFailures(t *testing.T) {
	const small = 1024 // MaxFrameBytes of the cases that need a small limit

	tests := []struct {
		name string
		opts tier.Options
		// misbehave drives a raw client up to its violation.
		misbehave func(t *testing.T, tt *testTier) *rawClient
		wantClose websocket.StatusCode
		wantError string // code of the error frame sent before the close
	}{
		{
			name: "malformed JSON after auth",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				node := wire.NewNodeID()
				rc.authenticate(t, tt.Token(t, node))
				rc.sendRaw(t, websocket.MessageText, []byte(`{"type":"announce",`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "malformed JSON after announce",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(`not json`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			// encoding/json would read it as type cmd_ack: a smuggling shape.
			name: "type key in upper case after announce",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(`{"TYPE":"cmd_ack","msg_id":"`+wire.NewMsgID()+
					`","in_reply_to":"`+wire.NewMsgID()+`","payload":{"ok":true,"result":{}}}`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "type key twice after announce",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(`{"type":"stream","type":"cmd_ack","msg_id":"`+wire.NewMsgID()+
					`","in_reply_to":"`+wire.NewMsgID()+`","payload":{"ok":true,"result":{}}}`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "payload key in title case during auth",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.recv(t, wire.TypeHello, nil)
				rc.sendRaw(t, websocket.MessageText, []byte(`{"type":"auth","msg_id":"`+wire.NewMsgID()+
					`","payload":{},"Payload":{"token":"`+tt.Token(t, wire.NewNodeID())+`"}}`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "key twice inside a cmd_ack's result",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(`{"type":"cmd_ack","msg_id":"`+wire.NewMsgID()+
					`","in_reply_to":"`+wire.NewMsgID()+`","payload":{"ok":true,"result":{"node_id":"a","node_id":"b"}}}`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "empty in_reply_to after announce",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(`{"type":"cmd_ack","msg_id":"`+wire.NewMsgID()+
					`","in_reply_to":"","payload":{"ok":true,"result":{}}}`))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "auth token in title case",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.recv(t, wire.TypeHello, nil)
				rc.send(t, wire.TypeAuth, "", map[string]string{"Token": tt.Token(t, wire.NewNodeID())})
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "cmd_ack ok in two cases",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				node := wire.NewNodeID()
				rc, _ := tt.connectRaw(t, node)
				res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
				e := rc.recv(t, wire.TypeCmd, nil)
				rc.sendRaw(t, websocket.MessageText, []byte(`{"type":"cmd_ack","msg_id":"`+wire.NewMsgID()+
					`","in_reply_to":"`+e.MsgID+`","payload":{"ok":false,"OK":true,"result":{}}}`))
				t.Cleanup(func() { <-res }) // answered when the session ends, or at its deadline
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "unknown envelope type after auth",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.authenticate(t, tt.Token(t, wire.NewNodeID()))
				rc.send(t, "bogus", "", struct{}{})
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "unknown envelope type after announce",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.send(t, "bogus", "", struct{}{})
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "unexpected type after announce",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.send(t, wire.TypeAuth, "", wire.Auth{Token: "x"})
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "cmd_ack without in_reply_to",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.send(t, wire.TypeCmdAck, "", wire.CmdAck{OK: true})
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "binary frame",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.recv(t, wire.TypeHello, nil)
				b, _ := wire.Encode(wire.TypeAuth, "", wire.Auth{Token: tt.Token(t, wire.NewNodeID())})
				rc.sendRaw(t, websocket.MessageBinary, b)
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "no subprotocol",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, &websocket.DialOptions{})
				rc.recv(t, wire.TypeHello, nil)
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "auth payload without token",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.recv(t, wire.TypeHello, nil)
				rc.send(t, wire.TypeAuth, "", struct{}{})
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeBadRequest,
		},
		{
			name: "oversize frame after auth",
			opts: tier.Options{MaxFrameBytes: small},
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				var hello wire.Hello
				rc.recv(t, wire.TypeHello, &hello)
				if hello.MaxFrameBytes != small {
					t.Errorf("hello max_frame_bytes %d, want %d", hello.MaxFrameBytes, small)
				}
				rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.Token(t, wire.NewNodeID())})
				rc.recv(t, wire.TypeAuthOK, nil)
				rc.send(t, wire.TypeAnnounce, "", map[string]string{"pad": strings.Repeat("x", 2*small)})
				return rc
			},
			wantClose: wire.CloseTooLarge, wantError: schemas.CodeBadRequest,
		},
		{
			name: "frame one byte over the limit after announce",
			opts: tier.Options{MaxFrameBytes: small},
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(strings.Repeat(" ", small+1)))
				return rc
			},
			wantClose: wire.CloseTooLarge, wantError: schemas.CodeBadRequest,
		},
		{
			// Larger than the WebSocket library's own 32 KiB default too:
			// the tier must answer 4413, not the library's 1009.
			name: "frame over the default 64 KiB limit",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc, _ := tt.connectRaw(t, wire.NewNodeID())
				rc.sendRaw(t, websocket.MessageText, []byte(strings.Repeat(" ", wire.DefaultMaxFrameBytes+1)))
				return rc
			},
			wantClose: wire.CloseTooLarge, wantError: schemas.CodeBadRequest,
		},
		{
			name: "no auth within the deadline",
			opts: tier.Options{AuthTimeout: 300 * time.Millisecond},
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				var hello wire.Hello
				rc.recv(t, wire.TypeHello, &hello)
				if hello.AuthDeadlineMs != 300 {
					t.Errorf("hello auth_deadline_ms %d, want 300", hello.AuthDeadlineMs)
				}
				return rc // and say nothing
			},
			wantClose: wire.CloseAuthFailed, wantError: schemas.CodeDeadlineExceeded,
		},
		{
			name: "no announce within the deadline",
			opts: tier.Options{AuthTimeout: 300 * time.Millisecond},
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.authenticate(t, tt.Token(t, wire.NewNodeID()))
				return rc
			},
			wantClose: wire.CloseAuthFailed, wantError: schemas.CodeDeadlineExceeded,
		},
		{
			name: "garbage token",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				return authWith(t, tt, "not.a.jwt")
			},
			wantClose: wire.CloseAuthFailed, wantError: schemas.CodeSafetyDenied,
		},
		{
			name: "expired token",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				return authWith(t, tt, tt.Mint(t, auth.MintOptions{
					Subject: wire.NewNodeID(), Tenant: tiertest.Tenant, Scopes: []string{auth.ScopeDeviceConnect},
					Audience: auth.AudienceDevice, Now: time.Now().Add(-2 * time.Hour), TTL: time.Hour,
				}))
			},
			wantClose: wire.CloseAuthFailed, wantError: schemas.CodeSafetyDenied,
		},
		{
			name: "agent token (gateway audience)",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				return authWith(t, tt, tt.Mint(t, auth.MintOptions{
					Subject: wire.NewNodeID(), Tenant: tiertest.Tenant, Scopes: []string{auth.ScopeDeviceConnect},
					Audience: auth.AudienceGateway,
				}))
			},
			wantClose: wire.CloseAuthFailed, wantError: schemas.CodeSafetyDenied,
		},
		{
			name: "token of another signer",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				other, err := auth.LoadOrCreateSigner(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				tok, err := other.Mint(auth.MintOptions{Subject: wire.NewNodeID(), Tenant: tiertest.Tenant,
					Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
				if err != nil {
					t.Fatal(err)
				}
				return authWith(t, tt, tok)
			},
			wantClose: wire.CloseAuthFailed, wantError: schemas.CodeSafetyDenied,
		},
		{
			name: "token lacking device:connect",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				return authWith(t, tt, tt.Mint(t, auth.MintOptions{
					Subject: wire.NewNodeID(), Tenant: tiertest.Tenant, Scopes: []string{auth.ScopeReadOnly},
					Audience: auth.AudienceDevice,
				}))
			},
			wantClose: wire.CloseForbidden, wantError: schemas.CodeSafetyDenied,
		},
		{
			name: "token subject not a node id",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				return authWith(t, tt, tt.Mint(t, auth.MintOptions{
					Subject: "alice", Tenant: tiertest.Tenant, Scopes: []string{auth.ScopeDeviceConnect},
					Audience: auth.AudienceDevice,
				}))
			},
			wantClose: wire.CloseForbidden, wantError: schemas.CodeSafetyDenied,
		},
		{
			name: "announce for another node",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				rc.authenticate(t, tt.Token(t, wire.NewNodeID()))
				rc.send(t, wire.TypeAnnounce, "", manifest(wire.NewNodeID(), echoCapability()))
				return rc
			},
			wantClose: wire.CloseForbidden, wantError: schemas.CodeSafetyDenied,
		},
		{
			name:      "manifest with an unknown kind",
			misbehave: announceWith(func(c *schemas.Capability) { c.Kind = "system.gpio" }),
			wantClose: wire.CloseMalformed, wantError: schemas.CodeManifestInvalid,
		},
		{
			name:      "manifest with a 60-character cap_id",
			misbehave: announceWith(func(c *schemas.Capability) { c.CapID = strings.Repeat("c", 60) }),
			wantClose: wire.CloseMalformed, wantError: schemas.CodeManifestInvalid,
		},
		{
			// 23 characters pass the schema (at most 24) but the projected
			// name sysecho.<26>.<23>.invoke has 65 characters.
			name:      "manifest projecting a tool name over 64 characters",
			misbehave: announceWith(func(c *schemas.Capability) { c.CapID = strings.Repeat("c", 23) }),
			wantClose: wire.CloseMalformed, wantError: schemas.CodeManifestInvalid,
		},
		{
			name:      "manifest with a verb its kind lacks",
			misbehave: announceWith(func(c *schemas.Capability) { c.Verbs = []string{"snapshot"} }),
			wantClose: wire.CloseMalformed, wantError: schemas.CodeManifestInvalid,
		},
		{
			name: "manifest with a duplicate cap_id",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				ok := rc.authenticate(t, tt.Token(t, wire.NewNodeID()))
				rc.send(t, wire.TypeAnnounce, "", manifest(ok.NodeID, echoCapability(), echoCapability()))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeManifestInvalid,
		},
		{
			name: "manifest without capabilities",
			misbehave: func(t *testing.T, tt *testTier) *rawClient {
				rc := tt.dial(t, nil)
				ok := rc.authenticate(t, tt.Token(t, wire.NewNodeID()))
				rc.send(t, wire.TypeAnnounce, "", manifest(ok.NodeID))
				return rc
			},
			wantClose: wire.CloseMalformed, wantError: schemas.CodeManifestInvalid,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTestTier(t, tc.opts)
			bystander := tt.runEcho(t)

			rc := tc.misbehave(t, tt)
			code, frames := rc.waitClose(t)
			if code != tc.wantClose {
				t.Errorf("close code %d, want %d", code, tc.wantClose)
			}
			if len(frames) != 1 || frames[0].Code != tc.wantError {
				t.Errorf("error frames %+v, want one with code %s", frames, tc.wantError)
			}
			tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
				return e.Decision == bus.DecisionProtocol && e.Code == strconv.Itoa(int(tc.wantClose))
			})

			tt.Echo(t, bystander.node)
		})
	}
}

// authWith dials and authenticates with token, expecting a refusal.
func authWith(t *testing.T, tt *testTier, token string) *rawClient {
	t.Helper()
	rc := tt.dial(t, nil)
	rc.recv(t, wire.TypeHello, nil)
	rc.send(t, wire.TypeAuth, "", wire.Auth{Token: token})
	return rc
}

// announceWith authenticates and announces the echo capability changed by
// edit, expecting a refusal.
func announceWith(edit func(*schemas.Capability)) func(*testing.T, *testTier) *rawClient {
	return func(t *testing.T, tt *testTier) *rawClient {
		t.Helper()
		rc := tt.dial(t, nil)
		ok := rc.authenticate(t, tt.Token(t, wire.NewNodeID()))
		c := echoCapability()
		edit(&c)
		rc.send(t, wire.TypeAnnounce, "", manifest(ok.NodeID, c))
		return rc
	}
}

// TestReplacedSession connects one node twice: the first session gets 4409,
// the second keeps the node, its subject and its registry record.
func TestReplacedSession(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	bystander := tt.runEcho(t)
	node := wire.NewNodeID()

	first, firstOK := tt.connectRaw(t, node)
	if r := tt.Record(t, node); r == nil || r.SessionID != firstOK.SessionID {
		t.Fatalf("registry record %+v, want session %s", r, firstOK.SessionID)
	}

	second, secondOK := tt.connectRaw(t, node)
	if secondOK.SessionID == firstOK.SessionID {
		t.Fatal("two sessions share an id")
	}
	code, frames := first.waitClose(t)
	if code != wire.CloseReplaced {
		t.Errorf("first session closed with %d, want %d", code, wire.CloseReplaced)
	}
	if len(frames) != 0 {
		t.Errorf("error frames %+v before a 4409, want none", frames)
	}
	// The first session has ended, lease released, once it says so.
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionDisconnect && e.NodeID == node
	})

	r := tt.Record(t, node)
	if r == nil {
		t.Fatal("registry record deleted when the replaced session ended")
	}
	if r.SessionID != secondOK.SessionID {
		t.Errorf("registry record of session %s, want the second, %s", r.SessionID, secondOK.SessionID)
	}
	if n := tt.Tier.Sessions(); n != 2 {
		t.Errorf("tier has %d sessions, want 2 (bystander and second)", n)
	}

	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	second.answerEcho(t, node)
	tiertest.WantOK(t, <-res)
	tt.Echo(t, bystander.node)
}

// TestBearerHeader authenticates with the upgrade request's Authorization
// header instead of an auth frame.
func TestBearerHeader(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc := tt.dial(t, &websocket.DialOptions{
		Subprotocols: []string{wire.Subprotocol},
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + tt.Token(t, node)}},
	})
	rc.recv(t, wire.TypeHello, nil)
	var ok wire.AuthOK
	rc.recv(t, wire.TypeAuthOK, &ok)
	if ok.NodeID != node || ok.Tenant != tiertest.Tenant || ok.SessionID == "" {
		t.Fatalf("auth_ok %+v, want node %s of %s", ok, node, tiertest.Tenant)
	}
	announced := rc.announce(t, node, echoCapability())
	if len(announced.Tools) != 1 || announced.Tools[0] != tiertest.EchoTool(node) {
		t.Fatalf("announce_ok tools %v, want [%s]", announced.Tools, tiertest.EchoTool(node))
	}
	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	rc.answerEcho(t, node)
	tiertest.WantOK(t, <-res)
}

// TestBadBearerHeader refuses a bad bearer header as it refuses a bad auth
// frame.
func TestBadBearerHeader(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	rc := tt.dial(t, &websocket.DialOptions{
		Subprotocols: []string{wire.Subprotocol},
		HTTPHeader:   http.Header{"Authorization": {"Bearer not.a.jwt"}},
	})
	rc.recv(t, wire.TypeHello, nil)
	if code, _ := rc.waitClose(t); code != wire.CloseAuthFailed {
		t.Fatalf("close code %d, want %d", code, wire.CloseAuthFailed)
	}
}

// TestLargeFrameWithinLimit answers a call with a frame just under the
// default limit, far over the WebSocket library's 32 KiB default.
func TestLargeFrameWithinLimit(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc, _ := tt.connectRaw(t, node)
	message := strings.Repeat("x", wire.DefaultMaxFrameBytes-1024)

	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	e := rc.recv(t, wire.TypeCmd, nil)
	result, _ := json.Marshal(tiertest.EchoResult{Message: message, NodeID: node})
	rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: result})
	r := <-res
	tiertest.WantOK(t, r)
	var got tiertest.EchoResult
	if err := json.Unmarshal(r.Reply.Result, &got); err != nil || got.Message != message {
		t.Fatalf("result of %d bytes (%v), want the %d-character message back", len(r.Reply.Result), err, len(message))
	}
}

// TestDeadlineCancel lets a cmd expire on a raw client: the caller gets
// E_DEADLINE_EXCEEDED, the device a cancel for that cmd, and the ack that
// comes after is dropped and audited.
func TestDeadlineCancel(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc := tt.dial(t, nil)
	rc.authenticate(t, tt.Token(t, node))
	rc.announce(t, node, tiertest.EchoCap("slow", schemas.Constraints{DeadlineMsDefault: 100}))

	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.Tool(node, "slow"), `{"message":"hi"}`)
	var cmd wire.Cmd
	e := rc.recv(t, wire.TypeCmd, &cmd)
	if cmd.DeadlineMs != 100 || string(cmd.Arguments) != `{"message":"hi"}` {
		t.Errorf("cmd %+v, want the arguments and deadline_ms 100", cmd)
	}
	if cancel := rc.recv(t, wire.TypeCancel, nil); cancel.InReplyTo != e.MsgID {
		t.Errorf("cancel in reply to %s, want the cmd %s", cancel.InReplyTo, e.MsgID)
	}
	tiertest.WantCode(t, <-res, schemas.CodeDeadlineExceeded)

	rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: json.RawMessage(`{}`)})
	tt.Audit.Wait(t, func(a tiertest.AuditEntry) bool {
		return a.Decision == bus.DecisionLateAck && a.NodeID == node && a.RequestID == e.MsgID
	})
}

// TestConnectionDroppedDuringCall drops the TCP connection, without a
// close handshake, while the device holds a cmd.
func TestConnectionDroppedDuringCall(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc, _ := tt.connectRaw(t, node)

	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	rc.recv(t, wire.TypeCmd, nil)
	_ = rc.c.CloseNow()
	tiertest.WantCode(t, <-res, schemas.CodeNodeOffline)
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionOffline && e.NodeID == node
	})
}

// TestDisconnectMarksNodeOffline checks that once a device is gone its
// registry record is marked offline and its subject has no responder.
func TestDisconnectMarksNodeOffline(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	d := tt.runEcho(t)
	events := tt.watch(t)
	if r := tt.Record(t, d.node); r == nil || r.Tenant != tiertest.Tenant || len(r.Capabilities) != 1 {
		t.Fatalf("registry record %+v, want the echo device's", r)
	}

	d.leave(t)
	waitEvent(t, events, func(e bus.Event) bool { return leftEvent(e, d.node) })
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionDisconnect && e.NodeID == d.node })
	if n := tt.Tier.Sessions(); n != 0 {
		t.Errorf("tier has %d sessions after the device left, want 0", n)
	}

	r := tt.Call(t.Context(), d.node, tiertest.Tenant, tiertest.EchoTool(d.node), `{"message":"hi"}`)
	if !errors.Is(r.Err, nats.ErrNoResponders) {
		t.Fatalf("call after disconnect: %v, want nats.ErrNoResponders", r)
	}
}

// TestShutdown closes every session with 1001, marks their records offline and
// refuses new connections.
func TestShutdown(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	rc, _ := tt.connectRaw(t, node)
	events := tt.watch(t)

	done := make(chan error, 1)
	go func() { done <- tt.Tier.Shutdown(t.Context()) }()
	code, frames := rc.waitClose(t)
	if code != wire.CloseGoingAway || len(frames) != 0 {
		t.Errorf("close %d with error frames %+v, want 1001 and none", code, frames)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := tt.Tier.Sessions(); n != 0 {
		t.Errorf("tier has %d sessions after Shutdown, want 0", n)
	}
	waitEvent(t, events, func(e bus.Event) bool { return leftEvent(e, node) })

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	_, resp, err := websocket.Dial(t.Context(), tt.URL, &websocket.DialOptions{
		Subprotocols: []string{wire.Subprotocol},
		HTTPClient:   &http.Client{Transport: tr},
	})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after shutdown: %v, %v; want 503", resp, err)
	}
}

// TestAuthAtTheDeadline sends auth just as the auth deadline expires, many
// times: each connection is either accepted or closed with 4401, and the
// deadline's close never races with the session learning who it is (run
// with -race).
func TestAuthAtTheDeadline(t *testing.T) {
	for _, timeout := range []time.Duration{500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			tt := newTestTier(t, tier.Options{AuthTimeout: timeout})
			token := tt.Token(t, wire.NewNodeID())
			for range 20 {
				rc := tt.dial(t, nil)
				if got := authRace(t, rc, token); got != wire.TypeAuthOK && got != "4401" {
					t.Fatalf("auth at the deadline ended with %s, want auth_ok or 4401", got)
				}
				_ = rc.c.CloseNow()
			}
		})
	}
}

// authRace answers hello with auth and returns what ends the exchange:
// "auth_ok", or the close code.
func authRace(t *testing.T, rc *rawClient, token string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
	defer cancel()
	for {
		_, b, err := rc.c.Read(ctx)
		if err != nil {
			return strconv.Itoa(int(websocket.CloseStatus(err)))
		}
		e, err := wire.DecodeEnvelope(rc.set, b)
		if err != nil {
			t.Fatalf("tier sent %s: %v", b, err)
		}
		switch e.Type {
		case wire.TypeHello:
			// The tier may have closed already; a failed write shows in the
			// next read.
			b, _ := wire.Encode(wire.TypeAuth, "", wire.Auth{Token: token})
			_ = rc.c.Write(ctx, websocket.MessageText, b)
		case wire.TypeError:
		case wire.TypeAuthOK:
			return e.Type
		default:
			t.Fatalf("tier sent %s", b)
		}
	}
}

// TestMissedPings drops a device that stops answering pings: 4408, and its
// node goes offline; with a timeout of its own too.
func TestMissedPings(t *testing.T) {
	for _, o := range []tier.Options{
		{PingInterval: 100 * time.Millisecond},
		{PingInterval: 150 * time.Millisecond, PingTimeout: 50 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%v+%v", o.PingInterval, o.PingTimeout), func(t *testing.T) {
			tt := newTestTier(t, o)
			events := tt.watch(t)
			node := wire.NewNodeID()
			rc, _ := tt.connectRaw(t, node) // and never reads again: no pongs

			tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
				return e.Decision == bus.DecisionProtocol && e.NodeID == node && e.Code == strconv.Itoa(wire.CloseLiveness)
			})
			_ = rc.c.CloseNow() // the tier's close handshake need not wait for us
			waitEvent(t, events, func(e bus.Event) bool { return leftEvent(e, node) })
			r := tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
			if !errors.Is(r.Err, nats.ErrNoResponders) {
				t.Fatalf("call after the device was dropped: %v, want nats.ErrNoResponders", r)
			}
		})
	}
}

// dialPinged is dial for a device that tells pinged of each ping it
// gets from the tier (dropping the news when pinged is full), and
// answers it.
func (tt *testTier) dialPinged(t *testing.T, pinged chan<- struct{}) *rawClient {
	t.Helper()
	return tt.dial(t, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol},
		OnPingReceived: func(context.Context, []byte) bool {
			select {
			case pinged <- struct{}{}:
			default:
			}
			return true
		}})
}

// TestPingOnlySilent: the tier pings a device only when it heard nothing
// from it for a whole interval. Devices that ping the tier on their own,
// send heartbeats, or send frames, more often than that are never pinged; a quiet device
// beside them, which answers pings, is pinged and kept. The quiet
// device's pings are the test's clock: three of them span more than two
// intervals.
func TestPingOnlySilent(t *testing.T) {
	tt := newTestTier(t, tier.Options{PingInterval: time.Second})
	connect := func(pinged chan struct{}) *rawClient {
		rc := tt.dialPinged(t, pinged)
		node := wire.NewNodeID()
		rc.authenticate(t, tt.Token(t, node))
		rc.announce(t, node, echoCapability())
		return rc
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Each talks every 50 ms, far more often than the interval.
	talkers := map[string]func(*rawClient) error{
		"pings":      func(rc *rawClient) error { return rc.c.Ping(ctx) },
		"heartbeats": func(rc *rawClient) error { return rc.body.Beat() }, // unsolicited pongs, unanswered
		"frames": func(rc *rawClient) error { // acks of nothing: dropped and audited
			b, err := wire.Encode(wire.TypeCmdAck, wire.NewMsgID(), wire.CmdAck{OK: true, Result: json.RawMessage(`{}`)})
			if err == nil {
				err = rc.c.Write(ctx, websocket.MessageText, b)
			}
			return err
		},
	}
	pinged := map[string]chan struct{}{}
	done := make(chan error, len(talkers))
	for name, talk := range talkers {
		pinged[name] = make(chan struct{}, 1)
		rc := connect(pinged[name])
		rc.c.CloseRead(ctx) // reads, so that pongs come back
		go func() {
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					done <- nil
					return
				case <-tick.C:
				}
				if err := talk(rc); err != nil && ctx.Err() == nil {
					done <- fmt.Errorf("%s: %w", name, err)
					return
				}
			}
		}()
	}
	quietPinged := make(chan struct{}, 8)
	quiet := connect(quietPinged)
	quietCtx := quiet.c.CloseRead(ctx)
	for i := range 3 {
		select {
		case <-quietPinged:
		case err := <-done:
			t.Fatalf("a talking device stopped: %v", err)
		case <-quietCtx.Done():
			t.Fatal("the quiet device, which answers pings, was dropped")
		case <-time.After(tiertest.WaitFor):
			t.Fatalf("the quiet device got %d pings, want 3", i)
		}
	}
	cancel()
	for range talkers {
		if err := <-done; err != nil {
			t.Fatalf("a talking device stopped: %v", err)
		}
	}
	for name, ch := range pinged {
		select {
		case <-ch:
			t.Errorf("the device that talks with %s was pinged", name)
		default:
		}
	}
}

// TestIdleBetweenMessages: a session that waits for its device between
// messages (idleConn) still hears every frame: pongs to its pings, which
// are no message, leave it waiting and the device kept; then a cmd_ack
// sent in fragments with the device's own ping between them completes its
// call, and so does the next call.
func TestIdleBetweenMessages(t *testing.T) {
	tt := newTestTier(t, tier.Options{PingInterval: 100 * time.Millisecond})
	pinged := make(chan struct{}, 16)
	rc := tt.dialPinged(t, pinged)
	node := wire.NewNodeID()
	rc.authenticate(t, tt.Token(t, node))
	rc.announce(t, node, echoCapability())

	// The device reads on its own goroutine, which answers pings.
	ctx, cancel := context.WithCancel(t.Context())
	frames := make(chan []byte)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			_, b, err := rc.c.Read(ctx)
			if err != nil {
				return
			}
			select {
			case frames <- b:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-readDone
	}()
	for i := range 3 {
		select {
		case <-pinged:
		case <-time.After(tiertest.WaitFor):
			t.Fatalf("the device got %d pings, want 3", i)
		}
	}

	for _, fragmented := range []bool{true, false} {
		calls := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
		var b []byte
		select {
		case b = <-frames:
		case <-time.After(tiertest.WaitFor):
			t.Fatal("no cmd")
		}
		e, err := wire.DecodeEnvelope(tt.Schemas, b)
		if err != nil || e.Type != wire.TypeCmd {
			t.Fatalf("got %s (%v), want a cmd", b, err)
		}
		res, _ := json.Marshal(tiertest.EchoResult{Message: "hi", NodeID: node, ReceivedAtMs: time.Now().UnixMilli()})
		ack, err := wire.Encode(wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: res})
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
		if fragmented {
			w, err := rc.c.Writer(wctx, websocket.MessageText)
			if err != nil {
				t.Fatal(err)
			}
			half := len(ack) / 2
			if _, err := w.Write(ack[:half]); err != nil { // a frame of its own
				t.Fatal(err)
			}
			if err := rc.c.Ping(wctx); err != nil { // between the fragments; the tier answers
				t.Fatalf("ping the tier between fragments: %v", err)
			}
			if _, err := w.Write(ack[half:]); err != nil {
				t.Fatal(err)
			}
			err = w.Close()
			if err != nil {
				t.Fatal(err)
			}
		} else if err := rc.c.Write(wctx, websocket.MessageText, ack); err != nil {
			t.Fatal(err)
		}
		wcancel()
		select {
		case r := <-calls:
			tiertest.WantOK(t, r)
		case <-time.After(tiertest.WaitFor):
			t.Fatalf("no reply (fragmented %v)", fragmented)
		}
	}
}
