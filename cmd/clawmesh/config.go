package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"strconv"

	"github.com/clawmesh/clawmesh/internal/configschema"
)

const configUsage = `usage: clawmesh config <command> [flags] [args]

commands:
  get [PROP]              print a property, a group or map entry, or the whole config
  set PROP=VALUE ...      set properties; several are one atomic config/set-many
  list [PREFIX]           print every property (defaults included) under PREFIX
  delete PROP             return a property to its default, or remove a map entry
  schema [PREFIX]         print the schema: type, default, secret, restart

VALUE is typed by the schema: a string property takes the text as it is,
a list of strings takes a,b,c or JSON, anything else takes JSON.
Secrets read ***MASKED***. Flags: --config-dir, --socket, --token.
`

// configCmd runs `clawmesh config`: a JSON-RPC client of the running stack,
// so the operator and a token-bound user go through the same
// authorization as any client.
func configCmd(args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, configUsage)
		return usageErrorf("config: no command")
	}
	cmd := args[0]
	if !slices.Contains([]string{"get", "list", "delete", "set", "schema", "help", "-h", "--help"}, cmd) {
		// Before the flags: `config bogus -h` is refused, not helped.
		fmt.Fprint(os.Stderr, configUsage)
		return usageErrorf("config: unknown command %q", cmd)
	}
	fs := flag.NewFlagSet("config "+cmd, flag.ContinueOnError)
	var sf socketFlags
	sf.register(fs)
	rest, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	// One PROP or PREFIX: a second was dropped without a word, and its
	// silence read as an answer.
	if (cmd == "get" || cmd == "list" || cmd == "schema") && len(rest) > 1 {
		what := "PREFIX"
		if cmd == "get" {
			what = "PROP"
		}
		return usageErrorf("config %s: want at most one %s, have %d", cmd, what, len(rest))
	}
	if cmd == "schema" {
		return printSchema(out, first(rest))
	}
	var (
		method string
		params map[string]any
	)
	switch cmd {
	case "get":
		method, params = "config/get", map[string]any{"prop": first(rest)}
	case "list":
		method, params = "config/list", map[string]any{"prefix": first(rest)}
	case "delete":
		if len(rest) != 1 {
			return usageErrorf("config delete: want one PROP")
		}
		method, params = "config/delete", map[string]any{"prop": rest[0]}
	case "set":
		if len(rest) == 0 {
			return usageErrorf("config set: want PROP=VALUE")
		}
		sets := make([]map[string]any, len(rest))
		for i, kv := range rest {
			prop, raw, ok := strings.Cut(kv, "=")
			if !ok || prop == "" {
				return usageErrorf("config set %q: want PROP=VALUE", kv)
			}
			v, err := configschema.ParseText(prop, raw)
			if err != nil {
				// The schema is the daemon's: refuse here with its words.
				return usageErrorf("config set %s: %w", prop, err)
			}
			sets[i] = map[string]any{"prop": prop, "value": v}
		}
		method, params = "config/set-many", map[string]any{"sets": sets}
		if len(sets) == 1 {
			method, params = "config/set", sets[0]
		}
	case "help", "-h", "--help":
		fmt.Fprint(out, configUsage)
		return nil
	default:
		fmt.Fprint(os.Stderr, configUsage)
		return usageErrorf("config: unknown command %q", cmd)
	}
	c, err := sf.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Call(method, params)
	if err != nil {
		return cliError(err)
	}
	return printResult(out, cmd, res)
}

func first(args []string) string {
	if len(args) > 0 {
		return args[0]
	}
	return ""
}

func printResult(out io.Writer, cmd string, res json.RawMessage) error {
	switch cmd {
	case "set", "delete":
		var r struct {
			Restart []string `json:"requires_restart"`
		}
		if json.Unmarshal(res, &r) == nil && len(r.Restart) > 0 {
			fmt.Fprintf(os.Stderr, "note: %s take(s) effect when the stack restarts\n", strings.Join(r.Restart, ", "))
		}
	case "get":
		var r struct {
			Value json.RawMessage `json:"value"`
		}
		if err := json.Unmarshal(res, &r); err != nil {
			return err
		}
		return printJSON(out, r.Value)
	case "list":
		var r struct {
			Entries []struct {
				Prop  string          `json:"prop"`
				Value json.RawMessage `json:"value"`
			} `json:"entries"`
		}
		if err := json.Unmarshal(res, &r); err != nil {
			return err
		}
		for _, e := range r.Entries {
			v, err := reencode(e.Value, "")
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s = %s\n", e.Prop, v)
		}
		return nil
	}
	return printJSON(out, res)
}

func printJSON(out io.Writer, raw json.RawMessage) error {
	b, err := reencode(raw, "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

// reencode writes the JSON value raw again, indented by indent (compact
// when ""), with <, > and & as themselves: the daemon's JSON escapes them
// (\u003c), and a system prompt "Use <b>" printed so was not the text the
// operator had set. Numbers keep their written form.
func reencode(raw json.RawMessage, indent string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// printSchema prints the schema table, which the CLI reads as data.
func printSchema(out io.Writer, prefix string) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tTYPE\tDEFAULT\tALLOWED\tFLAGS\tDESCRIPTION")
	for _, p := range configschema.Properties {
		if !strings.HasPrefix(p.Path, prefix) {
			continue
		}
		typ := string(p.Type)
		if p.Items != "" {
			typ += " of " + string(p.Items)
		}
		def := ""
		if p.Default != nil {
			b, _ := json.Marshal(p.Default)
			def = string(b)
		}
		var flags []string
		if p.Secret {
			flags = append(flags, "secret")
		}
		if p.Restart {
			flags = append(flags, "requires restart")
		}
		allowed := strings.Join(p.Enum, "|")
		switch {
		case allowed != "":
		case p.Min != nil && p.Max != nil:
			allowed = fmt.Sprintf("%s..%s", num(*p.Min), num(*p.Max))
		case p.Ref != "":
			allowed = "names in " + p.Ref
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Path, typ, def, allowed, strings.Join(flags, ","), p.Doc)
	}
	return tw.Flush()
}
