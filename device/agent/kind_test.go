package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/schemas"
)

// A registered kind's command gets seed 002's call_tool on stdin and
// answers one result or error object; the agent sets node_id, and maps
// an error's category as the remote tier does.
func TestKindHandler(t *testing.T) {
	const node = "01hzx9k3m4p7q8r9s0t1v2w3xy"
	dir := t.TempDir()
	seen := filepath.Join(dir, "request.json")
	sh := func(script string) []string { return []string{"/bin/sh", "-c", script} }
	for name, tc := range map[string]struct {
		command []string
		timeout time.Duration
		want    string // the result's JSON, or the error's code
	}{
		"result": {sh(`cat > "` + seen + `"; echo '{"type":"result","result":{"temperature":21.5,"node_id":"someone else"}}'`), 0,
			`{"node_id":"` + node + `","temperature":21.5}`},
		"error":     {sh(`echo '{"type":"error","error":{"name":"thermo","category":"invalid_arguments","message":"no such unit"}}'`), 0, schemas.CodeManifestInvalid},
		"own error": {sh(`echo '{"type":"error","error":{"name":"thermo","category":"sensor_broken","message":"x"}}'`), 0, schemas.CodeInternal},
		"two":       {sh(`echo '{"type":"result","result":{}}{}'`), 0, schemas.CodeInternal},
		"exit 2":    {sh(`echo '{"type":"result","result":{}}'; exit 2`), 0, schemas.CodeInternal},
		"slow":      {sh(`exec sleep 30`), 200 * time.Millisecond, schemas.CodeDeadlineExceeded},
		"missing":   {[]string{filepath.Join(dir, "no-such-command")}, 0, schemas.CodeInternal},
	} {
		t.Run(name, func(t *testing.T) {
			tool := agent.LocalTool{Name: "boiler", Kind: "acme.thermo", Verbs: []string{"read"}, Command: tc.command,
				SchemaRef: "mcp://schemas/acme.thermo.read.input@1.0.0", Safety: schemas.SafetyMutating, Timeout: 10 * time.Second}
			if tc.timeout > 0 {
				tool.Timeout = tc.timeout
			}
			res, err := agent.KindHandler(tool, "read", node, nil)(context.Background(), json.RawMessage(`{"unit":"C"}`))
			if err != nil {
				var e *schemas.Error
				if !errors.As(err, &e) || e.Code != tc.want {
					t.Fatalf("error %v, want %s", err, tc.want)
				}
				return
			}
			got, _ := json.Marshal(res)
			if string(got) != tc.want {
				t.Fatalf("result %s, want %s", got, tc.want)
			}
			req, _ := os.ReadFile(seen)
			if string(req) != `{"action":"call_tool","tool":"read","arguments":{"unit":"C"}}`+"\n" {
				t.Errorf("the command read %q", req)
			}
		})
	}
}
