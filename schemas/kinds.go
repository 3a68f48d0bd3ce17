package schemas

// Safety classes of a capability (seed 000 §5).
const (
	SafetyReadOnly    = "read_only"
	SafetyMutating    = "mutating"
	SafetyDestructive = "destructive"
)

// The built-in kinds: always in every [KindTable], never redefined.
const (
	KindEcho    = "system.echo"
	KindMetrics = "system.metrics"
	// KindGPIO is a simulated GPIO pin, the mutating demo kind of mock
	// devices: read is read-only, write mutates.
	KindGPIO = "sim.gpio"
	// KindLocal is seed 002's local tool (DESIGN.md §12): a command the
	// device's operator declared, run with the call's query in its
	// environment. Its safety class is the operator's word for each tool:
	// the kind clamps none.
	KindLocal = "local.tool"
)

// Verb describes one verb of a capability kind: the schemas of its
// arguments and of its result, and whether it streams.
type Verb struct {
	Name   string
	Input  string // $id of the arguments schema
	Output string // $id of the result schema (of each frame when Stream)
	Stream bool
	// Result is the $id of the schema of a stream's final result (how it
	// ended); empty for unary verbs, whose result is Output.
	Result string
	Title  string
	// Safety, when set, is the verb's own safety class, below its
	// capability's (reading a pin of a mutating GPIO capability is
	// read-only).
	Safety string
}

// SafetyOf returns the safety class of a verb of a capability of class
// capClass.
func (v Verb) SafetyOf(capClass string) string {
	if v.Safety != "" {
		return v.Safety
	}
	return capClass
}

// Kind is one entry of the kind table (DESIGN.md §5, §12): a built-in
// kind, or one major version of a kind an operator registered.
type Kind struct {
	Name       string
	Short      string // kind_short, the first segment of a projected name
	Idempotent bool
	// Safety is the safety class the manifest clamps the kind to; empty:
	// none, the device's word for each capability (local.tool, and a
	// registered kind whose clamp is any).
	Safety string
	Verbs  []Verb
	// Major is the major version of a registered kind's definition (its
	// schemas' $ids say it too); 0 for a built-in kind.
	Major int
}

// Registered reports whether k is an operator's kind, not a built-in one.
func (k Kind) Registered() bool { return k.Major > 0 }

// kinds is the table of built-in kinds. LookupKind hands out copies of its
// entries whose Verbs share the table's slices: every session of a tier
// keeps its kinds, and tens of thousands of copies of the same verbs would
// be memory for nothing. Callers must not modify Verbs.
var kinds = map[string]Kind{
	KindEcho: {Name: KindEcho, Short: "sysecho", Idempotent: true, Safety: SafetyReadOnly, Verbs: []Verb{
		{Name: "invoke", Input: EchoInput, Output: EchoOutput, Title: "Echo a message"},
	}},
	KindMetrics: {Name: KindMetrics, Short: "sys", Idempotent: true, Safety: SafetyReadOnly, Verbs: []Verb{
		{Name: "snapshot", Input: MetricsSnapInput, Output: MetricsSnapshot, Title: "Metrics snapshot"},
		{Name: "subscribe", Input: MetricsSubInput, Output: MetricsFrame, Stream: true, Result: MetricsSubOutput,
			Title: "Stream metrics"},
	}},
	KindGPIO: {Name: KindGPIO, Short: "gpio", Safety: SafetyMutating, Verbs: []Verb{
		{Name: "read", Input: GPIOReadInput, Output: GPIORead, Title: "Read a pin", Safety: SafetyReadOnly},
		{Name: "write", Input: GPIOWriteInput, Output: GPIOWrite, Title: "Drive a pin"},
	}},
	KindLocal: {Name: KindLocal, Short: localShort, Verbs: []Verb{
		{Name: "run", Input: LocalRunInput, Output: LocalRun, Title: "Run a device's own tool"},
	}},
}

// localShort is the kind_short of seed 002's local tools (DESIGN.md §12).
const localShort = "local"

// MaxLocalQuery is the most bytes a local tool's query may have: the
// arguments schema counts characters, the agent counts bytes too.
const MaxLocalQuery = 4096

// IsKindShort reports whether name is the kind_short of a built-in kind
// (a [KindTable] says it of registered ones too): the first segment of a
// device tool's name. Upstream names share that namespace
// (DESIGN.md §8): the listed (safe) names of a device's tools and of an
// upstream's could otherwise be the same.
func IsKindShort(name string) bool {
	for _, k := range kinds {
		if k.Short == name {
			return true
		}
	}
	return false
}

// LookupKind returns the entry of a built-in kind ([KindTable.Lookup]
// finds registered ones too).
func LookupKind(name string) (Kind, bool) {
	k, ok := kinds[name]
	return k, ok
}

// VerbByInput returns the verb of k whose arguments schema is id.
func (k Kind) VerbByInput(id string) (Verb, bool) {
	for _, v := range k.Verbs {
		if v.Input == id {
			return v, true
		}
	}
	return Verb{}, false
}

// Verb returns the named verb of k.
func (k Kind) Verb(name string) (Verb, bool) {
	for _, v := range k.Verbs {
		if v.Name == name {
			return v, true
		}
	}
	return Verb{}, false
}
