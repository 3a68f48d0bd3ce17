package roles

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/oklog/run"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// saying matches a line with message msg of role whose err says want.
func saying(msg, role, want string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		err, _ := m["err"].(string)
		return m["msg"] == msg && m["role"] == role && strings.Contains(err, want)
	}
}

// TestDeviceRolesSayWhyTheyCannotReachTheTier points an agent and a fleet
// at a port nothing listens on: the agent warns at once, saying the
// connection was refused; the fleet warns once for all its devices, with
// how many fail and why, and its progress line says why too. When a tier
// comes up there, each says once that it is back (the agent in its one
// "agent connected" line).
func TestDeviceRolesSayWhyTheyCannotReachTheTier(t *testing.T) {
	const devices = 5
	logs, c, np := deviceRolesBase(t)
	addr := closedAddr(t)
	urls := []string{"ws://" + addr + wire.Path}

	fleet, err := newFleetPart(c, fleetMock, devices, DefaultTenant, urls, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	fleet.watch.window = 200 * time.Millisecond
	ag, err := newAgentPart(c, agentSpec{urls: urls, dataDir: t.TempDir(), tenant: DefaultTenant})
	if err != nil {
		t.Fatal(err)
	}
	stopDevices := runParts(t, func(g *run.Group) { fleet.actors(g); ag.actors(g) })

	logs.wait(t, "the agent says the connection is refused", saying("device tier unreachable", "agent", "connection refused"))
	warn := logs.wait(t, "the fleet says the connection is refused", saying("device tier unreachable", "mock-fleet", "connection refused"))
	if warn["level"] != "WARN" || warn["of"] != float64(devices) {
		t.Errorf("fleet's line %v, want a warning about its %d devices", warn, devices)
	}
	logs.wait(t, "the fleet's progress says why", saying("mock devices connecting", "mock-fleet", "connection refused"))

	_, _ = startTier(t, c, np, addr)
	logs.wait(t, "fleet back", line("device tier back", "role", "mock-fleet", "connected", float64(devices)))
	logs.wait(t, "agent back", line("agent connected", "role", "agent", "connected", 1.0))
	stopDevices()
	for role, want := range map[string]map[string]int{
		"mock-fleet": {"device tier unreachable": 1, "device tier back": 1},
		// its first connection says it is back in the same line
		"agent": {"device tier unreachable": 1, "agent connected": 1, "device tier back": 0},
	} {
		for msg, w := range want {
			if n := logs.count(line(msg, "role", role)); n != w {
				t.Errorf("%d lines %q of %s, want %d:\n%s", n, msg, role, w, logs)
			}
		}
	}
}

// TestUnreachableTierRewarnsOncePerMinute runs a device against a port
// nothing listens on, on the bubble's clock: one warning at once, none
// more within the minute however many attempts fail, then one saying how
// many did.
func TestUnreachableTierRewarnsOncePerMinute(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	addr := closedAddr(t)
	synctest.Test(t, func(t *testing.T) {
		logs := newLogSink()
		w := newLinkWatch(slog.New(slog.NewJSONHandler(logs, nil)), 0)
		link := w.add()
		o := agent.MockOptions(wire.NewNodeID(), set, 1)
		o.URLs, o.Token = []string{"ws://" + addr + wire.Path}, "unchecked"
		o.MinBackoff, o.MaxBackoff = time.Second, 2*time.Second
		o.OnReady, o.OnLost, o.OnFail = func([]string) { link.ready() }, link.lost, link.failed
		d, err := agent.New(o)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := d.Run(ctx); err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		unreachable := line("device tier unreachable")

		synctest.Wait() // the first attempt failed; the device waits for the next
		if n := logs.count(unreachable); n != 1 {
			t.Fatalf("%d warnings after the first attempt, want 1:\n%s", n, logs)
		}
		time.Sleep(rewarnEvery - time.Second) // the bubble's clock: no real wait
		synctest.Wait()
		if n := logs.count(unreachable); n != 1 {
			t.Fatalf("%d warnings within the minute, want 1:\n%s", n, logs)
		}
		time.Sleep(3 * time.Second) // the bubble's clock
		synctest.Wait()
		if n := logs.count(unreachable); n != 2 {
			t.Fatalf("%d warnings after the minute, want 2:\n%s", n, logs)
		}
		again := logs.wait(t, "the second warning", func(m map[string]any) bool {
			n, _ := m["attempts_failed"].(float64)
			err, _ := m["err"].(string)
			return unreachable(m) && n > 10 && strings.Contains(err, "connection refused")
		})
		if again["level"] != "WARN" {
			t.Errorf("second line %v, want a warning", again)
		}
		cancel()
		<-done
		w.stop()
	})
}

// TestFleetRefusedSaysSoOnce runs a fleet whose tokens are signed by a
// key the tier does not know: the first device refused says why, with
// the close code and its meaning, in one error line for the fleet, and
// the progress line counts the refused devices.
func TestFleetRefusedSaysSoOnce(t *testing.T) {
	const devices = 3
	logs := newLogSink()
	log := slog.New(slog.NewJSONHandler(logs, nil))
	c, err := loadCommon(log, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	strange, err := loadCommon(log, t.TempDir()) // another signing key
	if err != nil {
		t.Fatal(err)
	}
	np, err := openNATS(t.Context(), natsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(np.close)
	tier, _ := startTier(t, c, np, "127.0.0.1:0")
	fleet, err := newFleetPart(strange, fleetMock, devices, DefaultTenant, []string{tier.url()}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	stop := runParts(t, fleet.actors)
	logs.wait(t, "every device refused", line("mock devices connecting", "role", "mock-fleet", "refused", float64(devices)))
	stop()
	if n := logs.count(saying("mock device stopped", "mock-fleet", "4401 (authentication failed or late)")); n != 1 {
		t.Errorf("%d lines say a device was refused with 4401 and why, want 1:\n%s", n, logs)
	}
}
