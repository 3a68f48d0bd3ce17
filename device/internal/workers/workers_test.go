package workers

import (
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestPool: every function runs once, and a blocked worker does not
// hold up the next function.
func TestPool(t *testing.T) {
	p := New(2)
	release := make(chan struct{})
	blocked := make(chan struct{})
	p.Run(func() { close(blocked); <-release }) // a worker stuck on a slow device
	<-blocked
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	for range 100 {
		wg.Add(1)
		p.Run(func() {
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
	p.Close() // the workers end, and Close waits for them: no leak to see
}

// TestCloseWaitsForBusyWorkers: Close returns only after the work in
// progress has returned.
func TestCloseWaitsForBusyWorkers(t *testing.T) {
	p := New(1)
	started, release := make(chan struct{}), make(chan struct{})
	var done bool
	p.Run(func() {
		close(started)
		<-release
		done = true // written before Close returns, read after it: no race
	})
	<-started
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a worker was busy")
	default:
	}
	close(release)
	<-closed
	if !done {
		t.Fatal("Close returned before the busy worker's work ended")
	}
}
