package mcp

import (
	"maps"
	"slices"
	"strings"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// verbWords are the opening words of a device tool's description, per
// kind and verb: the server's own, so that an agent choosing among
// tools reads okso's words and the node's checked name and labels,
// never text a device wrote. A verb not listed opens with its title
// from the kind table.
func verbWords(kind string, v schemas.Verb) string {
	switch kind + " " + v.Name {
	case schemas.KindEcho + " invoke":
		return "Echo a message on"
	case schemas.KindMetrics + " snapshot":
		return "Take a metrics snapshot of"
	case schemas.KindMetrics + " subscribe":
		return "Stream the metrics of"
	case schemas.KindGPIO + " read":
		return "Read the simulated pin of"
	case schemas.KindGPIO + " write":
		return "Drive the simulated pin of"
	case schemas.KindLocal + " run":
		return "Run a tool of its operator's on"
	}
	return v.Title + " on"
}

// describeDeviceTool writes the description of a device tool from the
// fixed template "<verb words> node <name> (<node_id>), labels k=v, …
// Safety class: <class>.": without a name, "node <node_id>"; without
// labels, no labels part. A name or labels that break their rules
// (which no tier writes) are left out rather than repeated.
func describeDeviceTool(kind string, v schemas.Verb, class string, rec *bus.Node) string {
	var b strings.Builder
	b.WriteString(verbWords(kind, v))
	b.WriteString(" node ")
	if schemas.ValidNodeName(rec.Name) {
		b.WriteString(rec.Name)
		b.WriteString(" (")
		b.WriteString(rec.NodeID)
		b.WriteString(")")
	} else {
		b.WriteString(rec.NodeID)
	}
	if len(rec.Labels) > 0 && schemas.CheckLabels(rec.Labels) == nil {
		keys := slices.Sorted(maps.Keys(rec.Labels))
		b.WriteString(", labels ")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(k)
			b.WriteString("=")
			b.WriteString(rec.Labels[k])
		}
	}
	b.WriteString(". Safety class: ")
	b.WriteString(class)
	b.WriteString(".")
	return b.String()
}

// operatorWords quotes what a local tool's operator wrote of it (its
// capability's description, DESIGN.md §12), after okso's own words: the
// one text of a device tool's description that okso did not write, kept
// apart and attributed so that a model reads it as the device's claim.
// The tier has checked it: at most 1024 characters, no control character
// but tab and line feed.
func operatorWords(desc string) string {
	if desc == "" {
		return ""
	}
	return " The device's operator describes it: \u00ab" + desc + "\u00bb"
}
