package configschema

import (
	"os"
	"strings"
	"testing"
)

// docPath spells a schema path as the documents do: a map entry's key as
// a placeholder (channels.plugin.<alias>.token).
func docPath(p Property) string {
	key := map[string]string{"channels.plugin": "<alias>", "plugins.entries": "<key>", "agents": "<alias>",
		"users": "<name>", "permission_profiles": "<name>", "durable.starters": "<id>"}
	for prefix, name := range key {
		if rest, ok := strings.CutPrefix(p.Path, prefix+".*."); ok {
			return prefix + "." + name + "." + rest
		}
	}
	return p.Path
}

// Every property of a channel binding is in the binding's table of
// docs/spec.md §8, and every secret is named where design.md lists what
// is encrypted at rest: the channel listener's token
// (channels.plugin.<alias>.token), without which the listener refuses
// every message, was in neither, and an operator who followed the spec
// got 401 from a listener it said took any POST.
func TestChannelAndSecretPropertiesDocumented(t *testing.T) {
	spec, err := os.ReadFile("../../docs/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	design, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Properties {
		if strings.HasPrefix(p.Path, "channels.plugin.*.") {
			if row := "| `" + docPath(p) + "` |"; !strings.Contains(string(spec), row) {
				t.Errorf("docs/spec.md §8's channel table has no row %s", row)
			}
		}
		if p.Secret && !strings.Contains(string(design), "`"+p.Path+"`") {
			t.Errorf("secret %s is not named in docs/design.md", p.Path)
		}
	}
}

// A value refused by a property's pattern is told what form it must
// have: "the secret is not in the expected form" left an operator
// setting channels.plugin.<alias>.token guessing, and so did `"8080" is
// not in the expected form` for a listener's address.
func TestPatternRefusalsSayTheForm(t *testing.T) {
	for _, tc := range []struct{ prop, text, says string }{
		{"channels.plugin.x.token", "short", "at least 32 printable ASCII characters without spaces"},
		{"durable.token", strings.Repeat("a", 31), "at least 32 printable ASCII characters without spaces"},
		{"channels.plugin.x.listen", "8080", "host:port"},
		{"agents.default.base_url", "host/v1", "http://, https:// or unix://"},
		{"plugins.security.trusted_publisher_keys", "abc", "64 lower-case hexadecimal"},
	} {
		_, err := ParseText(tc.prop, tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s=%s: %v, want it to say %q", tc.prop, tc.text, err, tc.says)
		}
		if p, _ := LookupLeaf(tc.prop); p != nil && p.Secret && err != nil && strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: the refusal echoes the secret: %v", tc.prop, err)
		}
	}
	for _, p := range Properties {
		if p.Pattern != nil && patternForms[p.Pattern] == "" {
			t.Errorf("%s: its pattern has no form in patternForms", p.Path)
		}
	}
}
