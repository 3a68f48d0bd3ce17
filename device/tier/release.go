package tier

import (
	"runtime/debug"
	"sync"
	"time"
)

// A connect storm (a fleet coming back after its tier's failover, or
// after a network partition) makes the tier's heap grow far beyond what
// its sessions keep: each handshake decodes and validates a manifest,
// reads and writes JetStream, and the garbage of a few hundred of them
// at once sets the heap's size. Go returns the freed pages to the OS only
// slowly, so a tier that took 1,000 devices kept twice the memory they
// need for minutes (make scale N=1000: 29 KB per connection, against 14
// at 10,000). So once a storm is over, the tier gives that memory back
// at once.
const (
	// stormHandshakes is how many handshakes make a storm.
	stormHandshakes = 256
	// stormQuiet is how long no handshake ends before a storm is over.
	stormQuiet = 2 * time.Second
)

// storms gives back the memory a storm of handshakes left, once no
// handshake has ended for stormQuiet. Its zero value is ready to use.
type storms struct {
	mu      sync.Mutex
	n       int       // handshakes ended since the last release
	last    time.Time // when the last one ended
	pending bool      // a check is scheduled
	free    func()    // nil: debug.FreeOSMemory; tests count calls instead
}

// ended counts a handshake that ended.
func (s *storms) ended() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = time.Now()
	if s.n++; s.n >= stormHandshakes && !s.pending {
		s.pending = true
		time.AfterFunc(stormQuiet, s.check)
	}
}

// check releases the memory if the storm is over, and looks again when
// it could be if not.
func (s *storms) check() {
	s.mu.Lock()
	if wait := stormQuiet - time.Since(s.last); wait > 0 {
		time.AfterFunc(wait, s.check)
		s.mu.Unlock()
		return
	}
	s.n, s.pending = 0, false
	free := s.free
	s.mu.Unlock()
	if free == nil {
		free = debug.FreeOSMemory
	}
	free()
}
