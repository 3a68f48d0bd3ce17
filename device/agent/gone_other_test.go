//go:build !linux

package agent_test

import "testing"

// waitGone is Linux's (a pidfd): elsewhere the test does not look.
func waitGone(t *testing.T, pid int) {
	t.Logf("not checking that process %d ended: no pidfd here", pid)
}
