package roles

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/bus"
)

// auditFeed is the dashboard's audit feed (POST /ui/api/audit) of a
// gateway, read as the page reads it: Server-Sent Events with the
// token in a header.
type auditFeed struct {
	events chan bus.AuditEvent // closed when the feed ends
}

// followAuditFeed opens the feed at the gateway whose MCP endpoint is
// mcpURL, waits for its ready event, and reads it until the test ends.
func followAuditFeed(t *testing.T, mcpURL, token string) *auditFeed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := strings.TrimSuffix(mcpURL, "/mcp") + "/ui/api/audit"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("POST %s: %v", url, err)
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		cancel()
		t.Fatalf("POST %s: %s", url, res.Status)
	}
	f := &auditFeed{events: make(chan bus.AuditEvent, 1024)}
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(f.events)
		sc := bufio.NewScanner(res.Body)
		event := ""
		for sc.Scan() {
			l := sc.Text()
			switch {
			case strings.HasPrefix(l, "event: "):
				event = l[len("event: "):]
				if event == "ready" {
					close(ready)
				}
			case strings.HasPrefix(l, "data: ") && event == "audit":
				var e bus.AuditEvent
				if json.Unmarshal([]byte(l[len("data: "):]), &e) == nil {
					select {
					case f.events <- e:
					default:
					}
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		res.Body.Close()
		<-done
	})
	select {
	case <-ready:
	case <-done:
		t.Fatalf("the audit feed of %s ended before it was ready", url)
	case <-time.After(10 * time.Second):
		t.Fatalf("the audit feed of %s not ready within 10 s", url)
	}
	return f
}

// wait returns the first event for which match holds, within 10 s.
func (f *auditFeed) wait(t *testing.T, what string, match func(bus.AuditEvent) bool) bus.AuditEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-f.events:
			if !ok {
				t.Fatalf("the audit feed ended before %s", what)
			}
			if match(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s in the audit feed within 10 s", what)
		}
	}
}
