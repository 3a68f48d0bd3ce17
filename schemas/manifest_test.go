package schemas_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

func echoCap(id string) schemas.Capability {
	return schemas.Capability{CapID: id, Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput,
		Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly}
}

func gpioCap(id string) schemas.Capability {
	return schemas.Capability{CapID: id, Kind: schemas.KindGPIO, SchemaRef: schemas.GPIOWriteInput,
		Verbs: []string{"read", "write"}, SafetyClass: schemas.SafetyMutating}
}

func TestProject(t *testing.T) {
	caps := []schemas.Capability{echoCap("echo"), gpioCap("pin")}
	before, _ := json.Marshal(caps)
	tools, err := schemas.Project(node, caps)
	if err != nil {
		t.Fatal(err)
	}
	type got struct{ name, verb, class string }
	var gots []got
	for _, tl := range tools {
		gots = append(gots, got{tl.Name, tl.Verb.Name, tl.Class})
		if tl.Cap != &caps[0] && tl.Cap != &caps[1] {
			t.Errorf("%s: Cap is not an element of the projected slice", tl.Name)
		}
		if n, ok := schemas.ParseToolName(tl.Name); !ok || n.NodeID != node || n.CapID != tl.Cap.CapID {
			t.Errorf("%s does not parse back to its node and capability", tl.Name)
		}
	}
	want := []got{
		{"sysecho." + node + ".echo.invoke", "invoke", schemas.SafetyReadOnly},
		{"gpio." + node + ".pin.read", "read", schemas.SafetyReadOnly}, // the verb's own class
		{"gpio." + node + ".pin.write", "write", schemas.SafetyMutating},
	}
	if !reflect.DeepEqual(gots, want) {
		t.Errorf("Project = %v, want %v", gots, want)
	}
	if after, _ := json.Marshal(caps); string(after) != string(before) {
		t.Errorf("Project modified its input: %s, was %s", after, before)
	}
}

// TestProjectLocalTool: a local tool projects one tool, run, whose class
// is its capability's (the kind clamps none), and the longest cap_id the
// manifest allows it still makes a valid name.
func TestProjectLocalTool(t *testing.T) {
	long := strings.Repeat("l", 24)
	caps := []schemas.Capability{
		{CapID: "restart", Kind: schemas.KindLocal, SchemaRef: schemas.LocalRunInput, Verbs: []string{"run"},
			SafetyClass: schemas.SafetyDestructive, Description: "Restart the camera."},
		{CapID: long, Kind: schemas.KindLocal, SchemaRef: schemas.LocalRunInput, Verbs: []string{"run"},
			SafetyClass: schemas.SafetyReadOnly, Description: "Tail a log."},
	}
	tools, err := schemas.Project(node, caps)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) != 2 || tools[0].Name != "local."+node+".restart.run" || tools[0].Class != schemas.SafetyDestructive ||
		tools[1].Name != "local."+node+"."+long+".run" || tools[1].Class != schemas.SafetyReadOnly {
		t.Errorf("Project = %+v", tools)
	}
	if len(tools[1].Name) > schemas.MaxToolName || tools[1].Verb.Output != schemas.LocalRun {
		t.Errorf("%s: %d characters, output %s", tools[1].Name, len(tools[1].Name), tools[1].Verb.Output)
	}
}

// TestProjectRefuses: what the manifest schema cannot say, Project does,
// for the tier and the gateway alike.
func TestProjectRefuses(t *testing.T) {
	badVerb := echoCap("echo")
	badVerb.Verbs = []string{"snapshot"}
	badKind := echoCap("echo")
	badKind.Kind = "system.shell"
	// The cap_id that makes the name 65 characters long.
	long := echoCap(strings.Repeat("e", schemas.MaxToolName+1-len("sysecho."+node+"..invoke")))
	upper := echoCap("Echo")
	for name, tc := range map[string]struct {
		node string
		caps []schemas.Capability
		msg  string
	}{
		"duplicate cap_id": {node, []schemas.Capability{echoCap("a"), gpioCap("a")}, "duplicate cap_id"},
		"unknown kind":     {node, []schemas.Capability{badKind}, "unknown kind"},
		"verb of another":  {node, []schemas.Capability{badVerb}, "verb not allowed for its kind"},
		"name too long":    {node, []schemas.Capability{long}, "projected tool name longer than 64 characters"},
		"cap_id grammar":   {node, []schemas.Capability{upper}, "projected tool name is not a valid tool name"},
		"node id":          {strings.ToUpper(node), []schemas.Capability{echoCap("echo")}, "node id is not a lower-case ULID"},
	} {
		tools, err := schemas.Project(tc.node, tc.caps)
		if err == nil || err.Error() != tc.msg || tools != nil {
			t.Errorf("%s: Project = %v, %v; want the error %q", name, tools, err, tc.msg)
		}
	}
}

// TestMaxCapabilities: the limit the tier checks before the schema is the
// schema's own.
func TestMaxCapabilities(t *testing.T) {
	s := load(t)
	manifest := func(n int) []byte {
		caps := make([]schemas.Capability, n)
		for i := range caps {
			caps[i] = echoCap("c" + string(rune('a'+i/26)) + string(rune('a'+i%26)))
		}
		b, _ := json.Marshal(map[string]any{"node_id": node, "agent": schemas.Agent{Name: "a", Version: "1"},
			"capabilities": caps})
		return b
	}
	if err := s.ValidateJSON(schemas.Manifest, manifest(schemas.MaxCapabilities)); err != nil {
		t.Errorf("%d capabilities refused: %v", schemas.MaxCapabilities, err)
	}
	if err := s.ValidateJSON(schemas.Manifest, manifest(schemas.MaxCapabilities+1)); err == nil {
		t.Errorf("%d capabilities accepted", schemas.MaxCapabilities+1)
	}
}
