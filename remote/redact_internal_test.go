package remote

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// TestScrub: credentials in an upstream's URL never reach the log.
func TestScrub(t *testing.T) {
	raw := "https://user:s3cret@tools.example.com/mcp?key=s3cret#frag"
	if got := redactURL(raw); got != "https://tools.example.com/mcp" {
		t.Errorf("redactURL = %q", got)
	}
	err := fmt.Errorf("list: %w", &url.Error{Op: "Post", URL: raw, Err: errors.New("connection refused")})
	if got := scrub(err); strings.Contains(got, "s3cret") || !strings.Contains(got, "tools.example.com/mcp") ||
		!strings.Contains(got, "connection refused") {
		t.Errorf("scrub = %q", got)
	}
}
