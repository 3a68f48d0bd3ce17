package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/yamlconf"
	"github.com/okso-io/okso/schemas"
)

// kindsCmd is okso kinds: the operator registers capability kinds
// (DESIGN.md §12) with the admin's NATS credential.
func kindsCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "kinds", Short: "Register device capability kinds of your own, and list them"}
	admin := &adminFlags{of: "gateways and device tiers"}
	flags := admin.add
	// with runs do with the bucket, on the admin's connection.
	with := func(cmd *cobra.Command, set *schemas.Set, do func(context.Context, *bus.Kinds) error) error {
		ctx, nc, because, done, err := admin.session(cmd, "okso-kinds", "register kinds")
		if err != nil {
			return err
		}
		defer done()
		k, err := bus.OpenKinds(ctx, nc, bus.KindsOptions{Schemas: set})
		if err == nil {
			err = do(ctx, k)
		}
		return because(err)
	}

	apply := &cobra.Command{
		Use:   "apply DIR",
		Short: "Register the kinds defined in DIR (each *.yaml a definition, its verbs' schemas in files beside it)",
		Long: "okso kinds apply reads every kind definition (*.yaml, *.yml) in DIR, with the schema files its\n" +
			"verbs name, checks them, and registers each kind's major version for every gateway and device\n" +
			"tier. A kind's major version, once applied, never changes: applying the same content again does\n" +
			"nothing, other content is refused (give it a new major version). Built-in kinds cannot be redefined.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := schemas.Load()
			if err != nil {
				return err
			}
			defs, err := readKindDir(set, args[0])
			if err != nil {
				return err
			}
			return with(cmd, set, func(ctx context.Context, k *bus.Kinds) error {
				for _, d := range defs {
					applied, err := k.Apply(ctx, d.def)
					if err != nil {
						return fmt.Errorf("%s: %w", d.file, err)
					}
					state := "unchanged"
					if applied {
						state = "applied"
					}
					fmt.Fprintf(stdout, "%s %s (version %s): %s\n", state, d.def.Key(), d.def.Version, kindLine(d.def))
				}
				return nil
			})
		},
	}
	flags(apply)

	list := &cobra.Command{
		Use:   "list",
		Short: "List the registered kinds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			set, err := schemas.Load()
			if err != nil {
				return err
			}
			return with(cmd, set, func(ctx context.Context, k *bus.Kinds) error {
				kt, err := k.Table(ctx)
				if err != nil {
					return err
				}
				for _, d := range kt.Defs() {
					fmt.Fprintf(stdout, "%s version %s: %s\n", d.Key(), d.Version, kindLine(d))
				}
				fmt.Fprintf(stdout, "%d registered kinds\n", len(kt.Defs()))
				return nil
			})
		},
	}
	flags(list)
	cmd.AddCommand(apply, list)
	return cmd
}

// kindLine says what a kind is in one line.
func kindLine(d *schemas.KindDef) string {
	safety := d.Safety
	if safety == "" {
		safety = "any (each capability's own)"
	}
	verbs := make([]string, len(d.Verbs))
	for i, v := range d.Verbs {
		verbs[i] = v.Name
	}
	return fmt.Sprintf("kind_short %s, safety %s, idempotent %t, verbs %s", d.Short, safety, d.Idempotent, strings.Join(verbs, ", "))
}

// kindFile is one definition read from a kinds directory.
type kindFile struct {
	file string
	def  *schemas.KindDef
}

// readKindDir reads and checks every definition in dir. An error names
// the file at fault, and for a definition the line and field.
func readKindDir(set *schemas.Set, dir string) ([]kindFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the kinds directory: %w", err)
	}
	var out []kindFile
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			continue
		}
		d, err := readKindFile(set, dir, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, kindFile{file: filepath.Join(dir, e.Name()), def: d})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no kind definition (*.yaml)", dir)
	}
	return out, nil
}

// readKindFile reads one definition, with the schema files its verbs
// name (in dir), and checks it.
func readKindFile(set *schemas.Set, dir, name string) (*schemas.KindDef, error) {
	path := filepath.Join(dir, name)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	f := kindForm()
	root, v, err := f.Checked(data, path, schemas.KindDefinition, func(v any) error { return set.Validate(schemas.KindDefinition, v) })
	if err != nil {
		return nil, err
	}
	files := map[string]string{} // "verb read input schema" -> its file
	for i, item := range v.(map[string]any)["verbs"].([]any) {
		verb := item.(map[string]any)
		for _, which := range []string{"input", "output"} {
			ref, ok := verb[which].(string)
			if !ok {
				continue // the schema, inline
			}
			at := []string{"verbs", strconv.Itoa(i), which}
			if !filepath.IsLocal(ref) {
				return nil, f.ErrAt(path, root, at, "%s is not a file name inside %s", yamlconf.Quote(ref), dir)
			}
			file := filepath.Join(dir, ref)
			raw, err := os.ReadFile(file)
			if err != nil {
				return nil, f.ErrAt(path, root, at, "read its schema: %v", err)
			}
			doc, err := schemas.Decode(raw)
			if err != nil {
				return nil, fmt.Errorf("%s: not one JSON document: %w", file, err)
			}
			verb[which] = doc
			files[fmt.Sprintf("verb %v %s schema", verb["name"], which)] = file
		}
	}
	stored, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d, err := set.CompileKind(stored)
	if err != nil {
		for at, file := range files {
			if strings.HasPrefix(err.Error(), at+":") {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// kindKeys are a definition's keys, in the schema's order.
const kindKeys = "name, kind_short, safety, idempotent, version, verbs"

// kindForm is a kind definition's kind of file.
func kindForm() *yamlconf.Form {
	return &yamlconf.Form{
		Empty: "want a kind definition: " + kindKeys,
		IsIndex: func(loc []string, i int) bool {
			_, err := strconv.Atoi(loc[i])
			return err == nil && i == 1 && loc[0] == "verbs"
		},
		Describe: describeKind,
	}
}

// describeKind words one broken rule of a kind definition.
func describeKind(root *yaml.Node, doc any, e *jsonschema.ValidationError) (field, at []string, msg string) {
	loc := e.InstanceLocation
	shown := func() string { return yamlconf.Shown(yamlconf.ValueAt(doc, loc), false) }
	last := ""
	if len(loc) > 0 {
		last = loc[len(loc)-1]
	}
	switch k := e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		at := append(slices.Clone(loc), yamlconf.FirstByLine(root, loc, k.Properties))
		if len(loc) == 0 {
			return at, at, "unknown key; a kind has " + kindKeys
		}
		return at, at, "unknown key; a verb has name, title, input, output"
	case *kind.Required:
		at := append(slices.Clone(loc), k.Missing[0])
		return at, loc, "missing"
	case *kind.Enum:
		var want []string
		for _, w := range k.Want {
			want = append(want, fmt.Sprint(w))
		}
		return loc, loc, shown() + " is not one of " + strings.Join(want, ", ")
	case *kind.Pattern:
		switch last {
		case "name":
			if len(loc) == 1 {
				return loc, loc, shown() + " is not a kind name: vendor.thing, each a lower-case letter then up to 15 of a-z, 0-9 and _"
			}
			return loc, loc, shown() + " is not a verb: a lower-case letter, then up to 11 of a-z, 0-9 and _"
		case "kind_short":
			return loc, loc, shown() + " is not a kind_short: a lower-case letter, then 1 to 11 of a-z and 0-9"
		case "version":
			return loc, loc, shown() + " is not a version such as 1.0.0"
		}
		return loc, loc, "holds a character it may not"
	case *kind.Type:
		return loc, loc, yamlconf.TypeMismatch(k.Want, k.Got)
	case *kind.MinItems:
		return loc, loc, "empty"
	case *kind.MaxItems:
		return loc, loc, fmt.Sprintf("more than %d", k.Want)
	case *kind.MinLength:
		return loc, loc, "empty"
	case *kind.MaxLength:
		return loc, loc, fmt.Sprintf("longer than %d characters", k.Want)
	}
	return loc, loc, "fails " + strings.Join(e.ErrorKind.KeywordPath(), "/") + " of " + schemas.KindDefinition
}
