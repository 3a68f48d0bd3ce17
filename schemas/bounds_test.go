package schemas_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// bomb is the schema whose check doubles in cost per level: allOf of two
// $refs to the level below, n levels deep, at the place where the
// template puts %s.
func bomb(n int, template ...string) string {
	defs := []string{`"d0":{"type":"object"}`}
	for i := 1; i <= n; i++ {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i-1, i-1))
	}
	at := `{"$ref":"#/$defs/d` + fmt.Sprint(n) + `"}`
	if len(template) > 0 {
		at = fmt.Sprintf(template[0], at)
	}
	return `{"$defs":{` + strings.Join(defs, ",") + `},"allOf":[` + at + `]}`
}

// bombLimit is the deepest bomb the expansion bound admits: a check of
// it evaluates 3·2ⁿ+… subschemas at the root.
const bombLimit = 7

func boundOf(err error) string {
	var be *schemas.BoundError
	if errors.As(err, &be) {
		return be.Bound
	}
	return ""
}

// TestBoundsRefuseTheBomb: the bomb is refused at every depth past the
// bound, in an input schema, nested under a property, and in an output
// schema alike (one compiler), with an error that names the bound.
func TestBoundsRefuseTheBomb(t *testing.T) {
	for _, n := range []int{bombLimit + 1, 12, 21, 30} {
		for name, raw := range map[string]string{
			"root":     bomb(n),
			"property": bomb(n, `{"type":"object","properties":{"x":%s}}`),
			"items":    bomb(n, `{"type":"array","items":%s}`),
		} {
			_, err := schemas.CompileForeign(json.RawMessage(raw))
			if boundOf(err) != "expansion" {
				t.Errorf("bomb %d at %s: %v, want the expansion bound", n, name, err)
			}
			if err != nil && !strings.Contains(err.Error(), "512") {
				t.Errorf("bomb %d: %q does not say the bound", n, err)
			}
		}
	}
	f, err := schemas.CompileForeign(json.RawMessage(bomb(bombLimit)))
	if err != nil {
		t.Fatalf("the bomb at the bound: %v", err)
	}
	if err := f.ValidateJSON([]byte(`{}`)); err != nil {
		t.Errorf("{} against the bomb at the bound: %v", err)
	}
}

// TestBoundsRefuse: each bound refuses a schema past it, and names it.
func TestBoundsRefuse(t *testing.T) {
	deep := `{"enum":[` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `]}`
	patterns := make([]string, 140)
	for i := range patterns {
		patterns[i] = `{"pattern":"[a-z]{1000}"}`
	}
	enum := make([]string, 3000)
	for i := range enum {
		enum[i] = "0"
	}
	for name, c := range map[string]struct{ raw, bound string }{
		"size":             {`{"description":"` + strings.Repeat("x", schemas.MaxForeignSchema) + `"}`, "size"},
		"depth":            {deep, "depth"},
		"cycle":            {`{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"allOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"}`, "cycle"},
		"pattern":          {`{"type":"string","pattern":"[a-z]{1000}[0-9]{1000}x"}`, "pattern"},
		"work":             {`{"type":"string","allOf":[` + strings.Join(patterns[:7], ",") + `]}`, ""},
		"work, more":       {`{"type":"string","$defs":{"p":{"pattern":"[a-z]{1000}"}},"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/p"},`, 140), ",") + `]}`, "work"},
		"enum":             {`{"$defs":{"e":{"enum":[` + strings.Join(enum, ",") + `]}},"allOf":[{"$ref":"#/$defs/e"},{"$ref":"#/$defs/e"}]}`, "work"},
		"anyOf fan":        {`{"anyOf":[` + strings.Repeat(`{"type":"string"},`, 600) + `{}]}`, "expansion"},
		"recursive growth": {`{"$defs":{"n":{"type":"object","properties":{"x":{"allOf":[{"$ref":"#/$defs/n"},{"$ref":"#/$defs/n"}]}}}},"$ref":"#/$defs/n"}`, "expansion"},
	} {
		_, err := schemas.CompileForeign(json.RawMessage(c.raw))
		if got := boundOf(err); got != c.bound {
			t.Errorf("%s: %v (bound %q), want bound %q", name, err, got, c.bound)
		}
	}
}

// TestBoundsAdmitRealServers: every input and output schema of the
// common public MCP servers (testdata/servers) is admitted, and checks a
// value of at least 64 KiB.
func TestBoundsAdmitRealServers(t *testing.T) {
	files, err := filepath.Glob("testdata/servers/*.json")
	if err != nil || len(files) < 10 {
		t.Fatalf("fixtures: %v, %d", err, len(files))
	}
	var tools int
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Tools []struct {
				Name         string          `json:"name"`
				InputSchema  json.RawMessage `json:"inputSchema"`
				OutputSchema json.RawMessage `json:"outputSchema"`
			} `json:"tools"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, tl := range list.Tools {
			for _, raw := range []json.RawMessage{tl.InputSchema, tl.OutputSchema} {
				if raw == nil {
					continue
				}
				tools++
				f, err := schemas.CompileForeign(raw)
				if err != nil {
					t.Errorf("%s %s: %v", filepath.Base(file), tl.Name, err)
					continue
				}
				// 64 KiB of ordinary JSON: 8,192 values, 2,048 of them
				// small numbers.
				if w := f.Work(); w.Cost(8192, 64<<10, 2048*schemas.NumberCost("123")) > schemas.ForeignBudget {
					t.Errorf("%s %s: does not check 64 KiB of JSON (work %+v)", filepath.Base(file), tl.Name, w)
				}
			}
		}
	}
	t.Logf("%d schemas of %d servers admitted", tools, len(files))
}

// TestValueBounds: numbers too long to compare, and values nested too
// deep for a recursive schema, are refused unchecked, and Explain names
// the argument and the bound, never the value.
func TestValueBounds(t *testing.T) {
	f, err := schemas.CompileForeign(json.RawMessage(`{"type":"object","properties":{"n":{"type":"number","minimum":0},"m":{"type":"integer"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for doc, want := range map[string]string{
		`{"n":1e400}`:                            "",
		`{"n":1.5e-400}`:                         "",
		`{"n":1e401}`:                            "argument n: a number with an exponent beyond ±400",
		`{"m":1e999999}`:                         "argument m: a number with an exponent beyond ±400",
		`{"n":` + strings.Repeat("7", 101) + `}`: "argument n: a number of more than 100 characters",
		`{"zz":[1e999999]}`:                      "an argument the schema does not declare (it declares: m, n): a number with an exponent beyond ±400",
	} {
		err := f.ValidateJSON([]byte(doc))
		if want == "" {
			if err != nil {
				t.Errorf("%.40s: %v", doc, err)
			}
			continue
		}
		if got := f.Explain(err); got != want {
			t.Errorf("%.40s: %q, want %q", doc, got, want)
		}
	}

	tree, err := schemas.CompileForeign(json.RawMessage(`{"$defs":{"t":{"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/t"}}}}},"$ref":"#/$defs/t"}`))
	if err != nil {
		t.Fatal(err)
	}
	nest := func(levels int) string {
		return strings.Repeat(`{"kids":[`, levels) + `{}` + strings.Repeat(`]}`, levels)
	}
	if err := tree.ValidateJSON([]byte(nest(31))); err != nil {
		t.Errorf("a tree 63 levels deep: %v", err)
	}
	if got := tree.Explain(tree.ValidateJSON([]byte(nest(40)))); !strings.Contains(got, "nested deeper than 64 levels") {
		t.Errorf("a tree 81 levels deep: %q", got)
	}
	// A schema that does not descend so deep checks deeper values.
	flat, _ := schemas.CompileForeign(json.RawMessage(`{"type":"object"}`))
	if err := flat.ValidateJSON([]byte(nest(400))); err != nil {
		t.Errorf("a deep value against a flat schema: %v", err)
	}

	// A value that would cost more than the budget is refused unchecked.
	heavy, err := schemas.CompileForeign(json.RawMessage(`{"type":"array","items":{"type":"string","allOf":[` + strings.Repeat(`{"pattern":"[a-z]{900}"},`, 7) + `{}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	fits := longestString(heavy.Work())
	ok := `["` + strings.Repeat("a", fits) + `"]`
	if err := heavy.ValidateJSON([]byte(ok)); err != nil {
		t.Errorf("a value within the budget: %s", heavy.Explain(err))
	}
	big := `["` + strings.Repeat("a", 2*fits) + `"]`
	if got := heavy.Explain(heavy.ValidateJSON([]byte(big))); !strings.Contains(got, "too large for this schema to check") {
		t.Errorf("a value over the budget: %q", got)
	}
}

// longestString is the longest string, in an array of one, that a
// schema of work w checks within the budget.
func longestString(w schemas.Work) int {
	return sort.Search(8<<20, func(n int) bool { return w.Cost(2, n+1, 0) > schemas.ForeignBudget })
}

// most is the most copies of an item of the given size (values, bytes,
// numbers' cost) that an array of them may hold within the budget, and
// within the gateway's largest request (1 MiB) of about text bytes each.
func most(w schemas.Work, values, bytes, numbers, text int) int {
	return min((1<<20)/text, sort.Search(1<<20, func(n int) bool {
		return w.Cost(1+(n+1)*values, (n+1)*bytes, (n+1)*numbers) > schemas.ForeignBudget
	}))
}

// BenchmarkBoundsWorst checks the worst schema each bound admits: the
// bomb at the expansion bound against {} (what a call costs), and the
// worst of each kind of work against the largest value the budget lets
// it check.
func BenchmarkBoundsWorst(b *testing.B) {
	patterns := strings.Repeat(`{"pattern":"[a-z]{1000}!"},`, 7) // run to the end of the string, never matched
	objects := `{"type":"array","items":{"allOf":[` + strings.Repeat(`{"type":"object"},`, 500) + `{}]}}`
	numbers := `{"type":"array","items":{"allOf":[` + strings.Repeat(`{"type":"integer","multipleOf":3,"minimum":-1},`, 20) + `{}]}}`
	big := "1." + strings.Repeat("3", 90) + "e400"
	for _, c := range []struct {
		name, schema string
		value        func(w schemas.Work) string
	}{
		{"expansion/{}", bomb(bombLimit), func(schemas.Work) string { return `{}` }},
		{"expansion/largest", bomb(bombLimit, `{"type":"array","items":%s}`), func(w schemas.Work) string {
			return "[" + strings.Repeat(`{},`, most(w, 1, 0, 0, 3)-1) + "{}]"
		}},
		{"work/small", `{"type":"string","allOf":[` + patterns + `{}]}`, func(schemas.Work) string { return `"` + strings.Repeat("a", 64) + `"` }},
		{"work/largest", `{"type":"string","allOf":[` + patterns + `{}]}`, func(w schemas.Work) string {
			return `"` + strings.Repeat("a", longestString(w)) + `"`
		}},
		{"members/largest", objects, func(w schemas.Work) string {
			n := most(w, 2, 6, 0, 11) // {"k00000":0}, mostly members of one object
			var o strings.Builder
			o.WriteString(`[{`)
			for i := range n {
				if i > 0 {
					o.WriteByte(',')
				}
				fmt.Fprintf(&o, `"k%05d":0`, i)
			}
			o.WriteString(`}]`)
			return o.String()
		}},
		{"numbers/largest", numbers, func(w schemas.Work) string {
			n := most(w, 1, len(big), schemas.NumberCost(big), len(big)+1)
			return "[" + strings.Repeat(big+",", n-1) + big + "]"
		}},
		{"unique/largest", `{"uniqueItems":true}`, func(w schemas.Work) string {
			// 20 arrays, equal but for their last number: every pair
			// compared to the end.
			n := most(w, 20, 20*6, 20*schemas.NumberCost("1e-400"), 20*7) - 1
			var a strings.Builder
			a.WriteByte('[')
			for i := range 20 {
				if i > 0 {
					a.WriteByte(',')
				}
				a.WriteString("[" + strings.Repeat("1e-400,", n) + strconv.Itoa(i) + "]")
			}
			a.WriteByte(']')
			return a.String()
		}},
		{"unique/collide", `{"uniqueItems":true}`, func(schemas.Work) string { return collidingItems(3000) }},
		{"trivial/largest", `{"type":"array","items":{"type":"integer","minimum":0}}`, func(w schemas.Work) string {
			return "[" + strings.Repeat(`1,`, most(w, 1, 1, schemas.NumberCost("1"), 2)-1) + "1]"
		}},
	} {
		f, err := schemas.CompileForeign(json.RawMessage(c.schema))
		if err != nil {
			b.Fatalf("%s: %v", c.name, err)
		}
		doc := []byte(c.value(f.Work()))
		if err := f.ValidateJSON(doc); err != nil && strings.Contains(f.Explain(err), "too large") {
			b.Fatalf("%s: %s", c.name, f.Explain(err))
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				_ = f.ValidateJSON(doc)
			}
		})
	}
}

// BenchmarkCompileBomb is what refusing the bomb costs.
func BenchmarkCompileBomb(b *testing.B) {
	raw := json.RawMessage(bomb(30))
	for b.Loop() {
		if _, err := schemas.CompileForeign(raw); err == nil {
			b.Fatal("compiled")
		}
	}
}

// TestBoundsRefuseCostlyNumbers: a number in a schema is compared as a
// fraction on every check, so it is bounded as a value's.
func TestBoundsRefuseCostlyNumbers(t *testing.T) {
	for _, raw := range []string{
		`{"enum":[1e99999]}`,
		`{"const":{"a":[` + strings.Repeat("9", 101) + `]}}`,
		`{"minimum":1e-99999}`,
	} {
		if _, err := schemas.CompileForeign(json.RawMessage(raw)); boundOf(err) != "number" {
			t.Errorf("%.40s: %v, want the number bound", raw, err)
		}
	}
}

// FuzzCompileForeign: any schema either compiles within the bounds or is
// refused, and one that compiles checks values without failing in any
// other way than by refusing them.
func FuzzCompileForeign(f *testing.F) {
	for _, s := range []string{
		bomb(3), bomb(3, `{"type":"array","items":%s}`),
		`{"$defs":{"t":{"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/t"}}}}},"$ref":"#/$defs/t"}`,
		`{"$dynamicAnchor":"n","anyOf":[{"type":"string","pattern":"^a+$"},{"items":{"$dynamicRef":"#n"}}]}`,
		`{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"items":{"$recursiveRef":"#"}}`,
		`{"$schema":"http://json-schema.org/draft-07/schema#","items":[{"type":"string"}],"additionalItems":{"enum":[1,2]},"dependencies":{"a":{"required":["b"]}}}`,
		`{"patternProperties":{"^x":{"minimum":1}},"additionalProperties":{"const":3},"propertyNames":{"maxLength":3},"unevaluatedProperties":false}`,
		`{"if":{"required":["a"]},"then":{"prefixItems":[{}],"contains":{"type":"null"}},"else":{"not":{}},"dependentSchemas":{"a":{}}}`,
	} {
		f.Add(s)
	}
	docs := [][]byte{[]byte(`{}`), []byte(`[]`), []byte(`"aaa"`), []byte(`{"a":[1,{"kids":[{}]},"x"],"x1":2}`), []byte(`[[["a"]],1.5e3]`)}
	f.Fuzz(func(t *testing.T, raw string) {
		s, err := schemas.CompileForeign(json.RawMessage(raw))
		if err != nil {
			return
		}
		if w := s.Work(); w.PerValue <= 0 || w.PerValue+w.PerByte > schemas.MaxForeignWork {
			t.Fatalf("work %+v past the bound", w)
		}
		for _, d := range docs {
			_ = s.Explain(s.ValidateJSON(d))
		}
	})
}

// costly is a schema the bounds refuse: at compile, past the bound
// named, or else its value, unchecked, as too large for it.
type costly struct{ name, schema, bound, value string }

func (c costly) check(t *testing.T) {
	f, err := schemas.CompileForeign(json.RawMessage(c.schema))
	if c.bound != "" {
		if boundOf(err) != c.bound {
			t.Fatalf("compiled: %v, want the %s bound", err, c.bound)
		}
		return
	}
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if got := f.Explain(f.ValidateJSON([]byte(c.value))); !strings.Contains(got, "too large for this schema to check") {
		t.Errorf("%d bytes: %q, want refused as too large (work %+v)", len(c.value), got, f.Work())
	}
}

// TestBoundsRefuseCostlyChecks: the ways a small schema admitted by
// the bounds could still make a check of a value within the gateway's
// 1 MiB cost seconds, or gigabytes, are refused: at compile, or as a
// value too large for the schema, unchecked.
func TestBoundsRefuseCostlyChecks(t *testing.T) {
	draft7 := `"$schema":"http://json-schema.org/draft-07/schema#",`
	repeat := func(s string, n int) string { return strings.TrimSuffix(strings.Repeat(s+",", n), ",") }
	zeros := make([]string, 3000)
	for i := range zeros {
		zeros[i] = "0"
	}
	big := "1." + strings.Repeat("3", 90) + "e400"
	for _, c := range []costly{
		{"numbers in an enum", `{"type":"array","$defs":{"e":{"enum":[` + strings.Join(zeros, ",") + `]}},"items":{"allOf":[{"$ref":"#/$defs/e"},{"$ref":"#/$defs/e"}]}}`, "work", ""},
		{"numbers compared", `{"type":"array","items":{"allOf":[` + repeat(`{"type":"integer","multipleOf":3.7e-400,"minimum":-3.7e-400}`, 100) + `]}}`, "",
			"[" + repeat(big, 2600) + "]"},
		{"uniqueItems", `{"uniqueItems":true}`, "",
			"[" + repeat("["+repeat("1e-400", 7489)+"]", 20) + "]"},
		{"dynamic reference", `{"$defs":{"t":{"$dynamicAnchor":"n"}},"items":{"$dynamicRef":"#n"}}`, "dynamic", ""},
		{"recursive reference", `{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"items":{"$recursiveRef":"#"}}`, "dynamic", ""},
		{"strings copied", `{"type":"string","allOf":[` + repeat(`{"maxLength":2000000}`, 511) + `]}`, "",
			`"` + strings.Repeat("a", 1<<20-2) + `"`},
		{"deep errors", `{"$defs":{"a":{"type":"array","items":{"$ref":"#/$defs/i"}},"i":{"anyOf":[{"$ref":"#/$defs/a"},{"allOf":[` +
			repeat(`{"type":"string"}`, 500) + `]}]}},"$ref":"#/$defs/a"}`, "work", ""},
		{"members scanned", `{"type":"array","items":{"allOf":[` + repeat(`{"type":"object"}`, 511) + `]}}`, "",
			`[{` + repeat(`"k":0`, 1) + `,` + func() string {
				var b strings.Builder
				for i := range 90000 {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, `"k%05d":0`, i)
				}
				return b.String()
			}() + `}]`},
		{"a chain of references", func() string {
			defs := make([]string, 1500)
			for i := range defs {
				defs[i] = fmt.Sprintf(`"c%d":{"$ref":"#/$defs/c%d"}`, i, i+1)
			}
			return `{"$defs":{` + strings.Join(defs, ",") + `,"c1500":{}},"$ref":"#/$defs/c0"}`
		}(), "expansion", ""},
		{"patterns, all together", `{"properties":{` + func() string {
			props := make([]string, 70)
			for i := range props {
				props[i] = fmt.Sprintf(`"p%d":{"pattern":"(?:\\pL?){660}N"}`, i)
			}
			return strings.Join(props, ",")
		}() + `}}`, "pattern", ""},
		{"names matched against patterns", `{"properties":{` + func() string {
			props := make([]string, 2000)
			for i := range props {
				props[i] = fmt.Sprintf(`"n%d":{}`, i)
			}
			return strings.Join(props, ",")
		}() + `},"patternProperties":{` + func() string {
			pats := make([]string, 60)
			for i := range pats {
				pats[i] = fmt.Sprintf(`"[a-z]\\d*[xyz]\\d{1,10}|q%d":{}`, i)
			}
			return strings.Join(pats, ",")
		}() + `}}`, "complexity", ""},
	} {
		t.Run(c.name, c.check)
	}

	// Formats are annotations: drafts 4 to 7 would check them, a
	// "regex" format by compiling the value (seconds and gigabytes for a
	// long one, and a shared map written from every check).
	f, err := schemas.CompileForeign(json.RawMessage(`{` + draft7 + `"type":"array","items":{"format":"regex"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := f.ValidateJSON([]byte(`["(", "[a-z]+", "` + strings.Repeat(`\\pL`, 1000) + `"]`)); err != nil {
				t.Errorf("a format was checked: %v", err)
			}
		})
	}
	wg.Wait()
}

// TestUniqueItems: okso's own uniqueItems check (the validator's hashes
// crafted items alike, then compares every pair) finds what JSON Schema
// deems equal, and only that.
func TestUniqueItems(t *testing.T) {
	f, err := schemas.CompileForeign(json.RawMessage(`{"uniqueItems":true}`))
	if err != nil {
		t.Fatal(err)
	}
	for doc, unique := range map[string]bool{
		`[1, 1.0]`:                           false,
		`[1, 10e-1]`:                         false,
		`[{"a":1,"b":2},{"b":2,"a":1}]`:      false,
		`[[1,"a"],[1,"a"]]`:                  false,
		`["a", "a"]`:                         false,
		`[null, null]`:                       false,
		`[["ab","c"],["a","bc"]]`:            true,
		`[[[]],[[],[]]]`:                     true,
		`[{"a":"bc"},{"ab":"c"}]`:            true,
		`[1, "1", true, null, [1], {"1":1}]`: true,
		`[0.1, 0.10000000000000001]`:         true,
		`[]`:                                 true,
	} {
		if err := f.ValidateJSON([]byte(doc)); (err == nil) != unique {
			t.Errorf("%s: %v, want unique %v", doc, err, unique)
		}
	}
	if got := f.Explain(f.ValidateJSON([]byte(`[3, 3]`))); !strings.Contains(got, "unique") {
		t.Errorf("Explain = %q", got)
	}

	// Distinct items the validator's hash would take for one another: a
	// linear check now (see BenchmarkBoundsWorst/unique/collide).
	if err := f.ValidateJSON([]byte(collidingItems(300))); err != nil {
		t.Errorf("distinct items: %v", err)
	}
}

// collidingItems is an array of n distinct items that the validator's
// own uniqueItems hash takes for one another: ten zeros, then a tree of
// nine nested empty arrays, each a different shape.
func collidingItems(n int) string {
	var trees []string
	var shapes func(nodes int) []string
	shapes = func(nodes int) []string { // the forests of nodes empty arrays
		if nodes == 0 {
			return []string{""}
		}
		var out []string
		for first := 1; first <= nodes && len(out) < n; first++ {
			for _, inside := range shapes(first - 1) {
				for _, rest := range shapes(nodes - first) {
					tree := "[" + inside + "]"
					if rest != "" {
						tree += "," + rest
					}
					out = append(out, tree)
					if len(out) >= n {
						return out
					}
				}
			}
		}
		return out
	}
	for _, forest := range shapes(9) {
		trees = append(trees, "[0,0,0,0,0,0,0,0,0,0,"+forest+"]")
	}
	return "[" + strings.Join(trees[:min(n, len(trees))], ",") + "]"
}

// TestBoundsRefuseCostlyChecksAgain: what a second review found.
func TestBoundsRefuseCostlyChecksAgain(t *testing.T) {
	names := func(n int) string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf(`"n%d"`, i)
		}
		return strings.Join(out, ",")
	}
	items := func(item string, n int) string {
		return "[" + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + "]"
	}
	for _, c := range []costly{
		{"a draft-07 enum of colliding arrays", `{"$schema":"http://json-schema.org/draft-07/schema#","enum":` + collidingItems(100) + `}`, "list", ""},
		{"dependencies lists", `{"type":"object","properties":{"x":{"type":"array","items":{"dependencies":{"a":[` + names(4000) + `]}}}}}`, "",
			`{"x":` + items(`{"a":0}`, 20000) + `}`},
		{"required lists", `{"type":"array","items":{"required":[` + names(4000) + `]}}`, "", items(`{}`, 20000)},
		{"a place met deeper", func() string {
			chain := make([]string, 60)
			for i := range chain {
				chain[i] = fmt.Sprintf(`"c%d":{"type":"object","properties":{"y":{"$ref":"#/$defs/c%d"}}}`, i, i+1)
			}
			return `{"$defs":{` + strings.Join(chain, ",") + `,"c60":{"$ref":"#/$defs/x"},` +
				`"x":{"type":"object","properties":{"y":{"type":"array","items":{"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"type":"string"},`, 500), ",") + `]}}}}},` +
				`"type":"object","properties":{"a":{"$ref":"#/$defs/x"},"b":{"$ref":"#/$defs/c0"}}}`
		}(), "work", ""},
	} {
		t.Run(c.name, c.check)
	}
}

// TestBoundsRefuseCostlyCompiles: what the compiler itself does before
// okso sees a schema (checking it against its draft's metaschema,
// building a pointer per subschema, looking each up in a list, checking
// lists unique with a collidable hash) is bounded by the document's
// bounds, and errors say why briefly.
func TestBoundsRefuseCostlyCompiles(t *testing.T) {
	long := strings.Repeat("n", 1000)
	nested := strings.Repeat(`{"$defs":{"`+long+`":`, 30) + `{}` + strings.Repeat(`}}`, 30)
	subschemas := `{"prefixItems":[` + strings.TrimSuffix(strings.Repeat(`{},`, 12000), ",") + `]}`
	arrays := make([]string, 900)
	for i := range arrays {
		arrays[i] = fmt.Sprintf(`[%d,[[]]]`, i)
	}
	for _, c := range []costly{
		{"long pointers", nested, "pointer", ""},
		{"many subschemas", subschemas, "values", ""},
		{"a required list of arrays", `{"required":[` + strings.Join(arrays, ",") + `]}`, "list", ""},
		{"a type list of arrays", `{"type":[` + strings.Join(arrays[:30], ",") + `]}`, "list", ""},
		{"a metaschema", `{"$ref":"http://json-schema.org/draft-07/schema#"}`, "complexity", ""},
	} {
		t.Run(c.name, c.check)
	}

	// A value's failure, and a schema's, are said briefly: the
	// validator's own text lists every failure (4.3 s and 2.8 GB to write
	// for this one).
	f, err := schemas.CompileForeign(json.RawMessage(`{"type":"object","properties":{"x":{"type":"array","items":{"enum":["` +
		strings.Repeat("a", 30000) + `","` + strings.Repeat("b", 30000) + `"]}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	err = f.ValidateJSON([]byte(`{"x":[` + strings.TrimSuffix(strings.Repeat("null,", 4000), ",") + `]}`))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("a value's failure says %d bytes", len(fmt.Sprint(err)))
	}
	if got := f.Explain(err); !strings.HasPrefix(got, "argument x[0]:") {
		t.Errorf("Explain = %q", got)
	}
	_, err = schemas.CompileForeign(json.RawMessage(`{"properties":{` + func() string {
		props := make([]string, 1000)
		for i := range props {
			props[i] = fmt.Sprintf(`"p%d":{"type":"nothing","minimum":"x"}`, i)
		}
		return strings.Join(props, ",")
	}() + `}}`))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("a schema's failure says %d bytes", len(fmt.Sprint(err)))
	}
}
