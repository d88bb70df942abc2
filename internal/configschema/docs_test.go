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
