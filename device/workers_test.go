package device

import (
	"sync"
	"testing"
)

// TestWorkers: every function runs once, and a blocked worker does not
// hold up the next function.
func TestWorkers(t *testing.T) {
	w := newWorkers(2)
	release := make(chan struct{})
	blocked := make(chan struct{})
	w.run(func() { close(blocked); <-release }) // a worker stuck on a slow device
	<-blocked
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	for range 100 {
		wg.Add(1)
		w.run(func() {
			defer wg.Done()
			mu.Lock()
			ran++
			mu.Unlock()
		})
	}
	wg.Wait() // would hang if the stuck worker held the others up
	close(release)
	if ran != 100 {
		t.Fatalf("ran %d functions, want 100", ran)
	}
	w.close() // the idle workers end: the package's leak check would see them otherwise
}
