package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestShownEscapesWhatIsNotText(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, é and 日本":        "plain text, é and 日本",
		"title \x1b]0;x\x07 clear":    `title \x1b]0;x\a clear`,
		"line\nfake line\r":           `line\nfake line\r`,
		"\u0085next \u202eevil\u2066": `\u0085next \u202eevil\u2066`,
		"bad \xff byte":               `bad \xff byte`,
		"tab\there":                   `tab\there`,
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %q, want %q", in, got, want)
		}
	}
}

// A registry index's entry and a plugin's skill are not the command's
// text: their control characters (a title set, the screen cleared, a
// line that reads like the command's own) reach the terminal escaped.
func TestPluginSearchAndInfoEscapeOthersText(t *testing.T) {
	dir := t.TempDir()
	raw, _ := json.Marshal(map[string]any{"plugins": []map[string]any{{
		"name": "evil", "version": "1.0.0", "url": "evil.zip",
		"description":  "calendar \x1b]0;pwned\x07\x1b[2J\rweather  9.9.9  tool  official",
		"capabilities": []string{"tool\x1b[8m"},
	}}})
	writeTestFile(t, filepath.Join(dir, "registry.json"), raw)
	var out bytes.Buffer
	if err := pluginCmd([]string{"search", "--registry", filepath.Join(dir, "registry.json"), "calendar"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\r\a") || !strings.Contains(out.String(), `calendar \x1b]0;pwned\a\x1b[2J\rweather`) {
		t.Fatalf("plugin search printed %q", out.String())
	}

	plugins := filepath.Join(dir, "plugins")
	writeTestFile(t, filepath.Join(plugins, "kit", "manifest.toml"), []byte("name = \"kit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n"))
	writeTestFile(t, filepath.Join(plugins, "kit", "skills", "s", "SKILL.md"), []byte("---\nname: s\ndescription: \"ok\\e]0;pwned\\a\\e[2K\\rsignature:     trusted\"\n---\n"))
	out.Reset()
	if err := pluginCmd([]string{"info", "--plugins-dir", plugins, "--socket", filepath.Join(dir, "none.sock"), "kit"}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\r\a") || !strings.Contains(out.String(), `ok\x1b]0;pwned\a\x1b[2K\rsignature:`) {
		t.Fatalf("plugin info printed %q", out.String())
	}
	// A name is a plugin's name, not a path out of the plugins folder.
	if err := pluginCmd([]string{"info", "--plugins-dir", plugins, "--socket", filepath.Join(dir, "none.sock"), "../plugins/kit"}, &out); err == nil ||
		!strings.Contains(err.Error(), "is not a plugin name") {
		t.Fatalf("info of a path: %v", err)
	}
}
