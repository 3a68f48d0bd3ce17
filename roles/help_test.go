package roles

import (
	"strings"
	"testing"
)

// TestHelpExamples: every server role's --help shows how to run it, and
// the flags an operator looks for to watch it.
func TestHelpExamples(t *testing.T) {
	for _, role := range []string{"all-in-one", "gateway", "device", "remote", "agent", "mock-fleet"} {
		var out, errOut syncBuffer
		root := NewRoot(&out, &errOut)
		root.SetArgs([]string{role, "--help"})
		if err := root.Execute(); err != nil {
			t.Fatalf("okso %s --help: %v", role, err)
		}
		help := out.String()
		if !strings.Contains(help, "Examples:\n  # ") || !strings.Contains(help, "  okso "+role) {
			t.Errorf("okso %s --help shows no example:\n%s", role, help)
		}
		for _, flag := range []string{"--metrics-addr", "--otlp-endpoint"} {
			if !strings.Contains(help, flag) {
				t.Errorf("okso %s --help has no %s", role, flag)
			}
		}
	}
}
