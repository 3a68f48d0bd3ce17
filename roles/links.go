package roles

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// fleetLinkWindow is how long a fleet's linkWatch waits after the first
// device lost its tier before it says so: a tier that goes away closes its
// thousands of sessions over a moment, and the line counts them all.
const fleetLinkWindow = 2 * time.Second

// rewarnEvery is how often, at most, a linkWatch says again that its
// devices still cannot reach their tier.
const rewarnEvery = time.Minute

// linkWatch turns the tier links of a set of devices, one agent or a fleet
// of thousands, into a few log lines per outage whatever their number:
// "device tier unreachable" window after the first device lost its link
// or failed to get one (at once for a zero window), counting every device
// the outage took and saying the most common reason; again at most once
// a minute while devices keep failing to reach the tier, with the
// attempts that failed meanwhile; and "device tier back" once each of
// them has its link again or was refused for good. A device stopped by
// its owner is no loss. After stop it writes nothing, and no timer of its
// runs. Make one with newLinkWatch; it is safe for concurrent use.
type linkWatch struct {
	log    *slog.Logger
	window time.Duration
	timers sync.WaitGroup // outage timers scheduled or running

	mu        sync.Mutex
	devices   int     // added and not refused
	connected int     // of them, those whose link is up
	out       *outage // nil between outages
	outages   int     // outages begun
	stopped   bool
}

// outage is one spell of a linkWatch's devices losing their tier.
type outage struct {
	n        int // its number, from 1
	start    time.Time
	lost     int   // devices that lost their link in it
	down     int   // of them, those still without it
	err      error // why the first one lost it
	reported bool  // the unreachable line is written
	timer    *time.Timer
	// reasons counts the devices down in it by why they last failed.
	reasons  map[string]int
	attempts int       // connection attempts failed since the last line
	said     time.Time // when the last unreachable line was written
}

// deviceLink is one device of a linkWatch. Its methods are called in turn
// from that device's Run goroutine (ready: OnReady, lost: OnLost) and
// after Run returned (refused).
type deviceLink struct {
	w      *linkWatch
	up     bool
	isDown bool   // lost its link in the current outage and not back
	outage int    // number of the last outage that counted it
	reason string // why it is down, while down
}

func newLinkWatch(log *slog.Logger, window time.Duration) *linkWatch {
	return &linkWatch{log: log, window: window}
}

// add adds a device to w.
func (w *linkWatch) add() *deviceLink {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.devices++
	return &deviceLink{w: w}
}

// stop ends w: it writes no line after it. It returns once no timer of
// w runs.
func (w *linkWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.out != nil && w.out.timer != nil && w.out.timer.Stop() {
		w.timers.Done() // its function will not run
	}
	w.mu.Unlock()
	w.timers.Wait()
}

// ready records that the device's link is up.
func (d *deviceLink) ready() {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	d.markUp()
	d.settle()
}

// markUp counts the device's link as up; w.mu is held.
func (d *deviceLink) markUp() {
	if !d.up {
		d.up = true
		d.w.connected++
	}
}

// readyAs records that the device's link is up, like ready, and writes
// one line msg with args: when the link ends an outage, that line says
// what "device tier back" would have (connected, of, lost, down_for) and
// stands for it, so a device that connects for the first time after
// failing to reach its tier writes one line, not two.
func (d *deviceLink) readyAs(msg string, args ...any) {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	d.markUp()
	if d.leave() && w.backAs(msg, args) {
		return
	}
	if !w.stopped {
		w.log.Info(msg, args...)
	}
}

// lost records that the device's link went down for err.
func (d *deviceLink) lost(err error) {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if d.up {
		d.up = false
		w.connected--
	}
	d.down(err)
}

// failed records that an attempt of the device to reach its tier failed
// for err: a device that never had its link is down as much as one that
// lost it.
func (d *deviceLink) failed(err error) {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	d.down(err)
	o := w.out
	o.attempts++
	if o.reported && !w.stopped && time.Since(o.said) >= rewarnEvery {
		o.reported = false
		w.report()
	}
}

// down counts the device down for err in the current outage, beginning
// one if none is; w.mu is held.
func (d *deviceLink) down(err error) {
	w := d.w
	o := w.out
	if o == nil {
		w.outages++
		o = &outage{n: w.outages, start: time.Now(), err: err, reasons: map[string]int{}}
		w.out = o
		if w.window > 0 && !w.stopped {
			w.timers.Add(1)
			o.timer = time.AfterFunc(w.window, func() {
				defer w.timers.Done()
				w.mu.Lock()
				defer w.mu.Unlock()
				if w.out == o {
					w.report()
				}
			})
		}
	}
	if d.outage != o.n {
		d.outage = o.n
		o.lost++
	}
	if !d.isDown {
		d.isDown = true
		o.down++
	} else {
		o.reasons[d.reason]--
	}
	d.reason = reason(err)
	o.reasons[d.reason]++
	if w.window <= 0 && !o.reported && o.said.IsZero() {
		w.report()
	}
}

// reason is what a log line says of err.
func reason(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}

// refused records that the tier refused the device for good: it is waited
// for no more.
func (d *deviceLink) refused() {
	w := d.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.devices--
	if d.up {
		d.up = false
		w.connected--
	}
	d.settle()
}

// settle takes the device out of the outage it is down in, if any; w.mu
// is held.
func (d *deviceLink) settle() {
	if d.leave() {
		d.w.back()
	}
}

// leave takes the device out of the outage it is down in, reporting
// whether it was in one; w.mu is held.
func (d *deviceLink) leave() bool {
	if !d.isDown {
		return false
	}
	d.isDown = false
	o := d.w.out
	o.down--
	if o.reasons[d.reason]--; o.reasons[d.reason] <= 0 {
		delete(o.reasons, d.reason)
	}
	d.reason = ""
	return true
}

// failing returns how many devices are down in the current outage and
// the most common reason among them.
func (w *linkWatch) failing() (n int, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.out == nil {
		return 0, ""
	}
	return w.out.down, w.out.commonReason()
}

// commonReason is why most of the devices down in o are; the first in
// order of a tie.
func (o *outage) commonReason() string {
	why, most := "", 0
	for r, n := range o.reasons {
		if n > most || n == most && r < why {
			why, most = r, n
		}
	}
	if why == "" {
		return reason(o.err)
	}
	return why
}

// report writes the unreachable line of the current outage, and the back
// line too if it is over already; w.mu is held.
func (w *linkWatch) report() {
	o := w.out
	if w.stopped || o.reported {
		return
	}
	o.reported = true
	args := []any{"disconnected", o.lost, "connected", w.connected, "of", w.devices, "failing", o.down}
	if !o.said.IsZero() {
		args = append(args, "attempts_failed", o.attempts,
			"down_for", time.Since(o.start).Round(time.Second).String())
	}
	o.said, o.attempts = time.Now(), 0
	w.log.Warn("device tier unreachable", append(args, "err", o.commonReason())...)
	w.back()
}

// back ends the current outage once it is reported and no device is down
// in it any more; w.mu is held.
func (w *linkWatch) back() { w.backAs("device tier back", nil) }

// backAs is back writing msg, with args before the outage's figures;
// it reports whether it wrote the line.
func (w *linkWatch) backAs(msg string, args []any) bool {
	o := w.out
	if w.stopped || o == nil || !o.reported || o.down > 0 {
		return false
	}
	w.out = nil
	w.log.Info(msg, append(args, "connected", w.connected, "of", w.devices, "lost", o.lost,
		"down_for", time.Since(o.start).Round(time.Millisecond).String())...)
	return true
}

// logNATSLink logs one line when nc loses its NATS server and one when it
// is connected again: nats.go reconnects on its own, and silently.
// Closing nc is no loss.
func logNATSLink(log *slog.Logger, nc *nats.Conn) {
	// nats.go runs a connection's handlers one at a time, on one goroutine.
	var lostAt time.Time
	nc.SetDisconnectErrHandler(func(nc *nats.Conn, err error) {
		if nc.IsClosed() {
			return
		}
		lostAt = time.Now()
		log.Warn("NATS connection lost", "err", err)
	})
	nc.SetReconnectHandler(func(nc *nats.Conn) {
		log.Info("NATS connection back", "nats_url", nc.ConnectedUrlRedacted(),
			"down_for", time.Since(lostAt).Round(time.Millisecond).String())
	})
}
