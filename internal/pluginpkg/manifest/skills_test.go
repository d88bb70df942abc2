package manifest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

const skillManifest = "name = \"toolkit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n"

// writeBundle writes a skill-only plugin: files maps a relative path to
// its content.
func writeBundle(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for rel, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSkillBundle(t *testing.T) {
	dir := writeBundle(t, map[string]string{
		"manifest.toml":                        skillManifest,
		"README.md":                            "overview",
		"skills/design-review/SKILL.md":        "---\nname: design-review\ndescription: >\n  Reviews a design\n  document.\nlicense: MIT\n---\n# Design review\n",
		"skills/design-review/references/x.md": "ref",
		"skills/code-review/SKILL.md":          "---\nname: code-review\ndescription: \"Reviews code\"\n---\nbody\n",
	})
	b, err := manifest.LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Skills) != 2 || b.Skills[0].ID != "plugin:toolkit/code-review" || b.Skills[1].ID != "plugin:toolkit/design-review" ||
		b.Skills[1].Description != "Reviews a design document." {
		t.Fatalf("skills = %+v", b.Skills)
	}
	if p, s, ok := manifest.ParseSkillID("plugin:toolkit/code-review"); !ok || p != "toolkit" || s != "code-review" {
		t.Fatal("ParseSkillID")
	}
	for _, bad := range []string{"toolkit/x", "plugin:../x", "plugin:a/../../b", "plugin:a/B"} {
		if _, _, ok := manifest.ParseSkillID(bad); ok {
			t.Fatalf("ParseSkillID(%q) accepted", bad)
		}
	}
}

func TestSkillBundleRefusals(t *testing.T) {
	good := "---\nname: a\ndescription: d\n---\n"
	cases := map[string]map[string]string{
		"no skills folder":    {},
		"empty skills folder": {"skills/README.md": "x"},
		"missing description": {"skills/a/SKILL.md": "---\nname: a\n---\n"},
		"empty description":   {"skills/a/SKILL.md": "---\nname: a\ndescription: \"  \"\n---\n"},
		"missing name":        {"skills/a/SKILL.md": "---\ndescription: d\n---\n"},
		"no front matter":     {"skills/a/SKILL.md": "# a\n"},
		"unclosed":            {"skills/a/SKILL.md": "---\nname: a\ndescription: d\n"},
		"bad yaml":            {"skills/a/SKILL.md": "---\nname: [a\n---\n"},
		"name is a list":      {"skills/a/SKILL.md": "---\nname: [a]\ndescription: d\n---\n"},
		"name differs":        {"skills/a/SKILL.md": "---\nname: b\ndescription: d\n---\n"},
		"no SKILL.md":         {"skills/a/notes.md": good},
		"bad folder name":     {"skills/A/SKILL.md": good},
		// Every skill's description goes into one listing.
		"description past 1024 bytes": {"skills/a/SKILL.md": "---\nname: a\ndescription: " + strings.Repeat("d", 1025) + "\n---\n"},
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			files["manifest.toml"] = skillManifest
			_, err := manifest.LoadBundle(writeBundle(t, files))
			if !errors.Is(err, manifest.ErrLayout) {
				t.Fatalf("err = %v, want ErrLayout", err)
			}
		})
	}
	t.Run("symlinked SKILL.md", func(t *testing.T) {
		dir := writeBundle(t, map[string]string{"manifest.toml": skillManifest, "outside.md": good})
		if err := os.MkdirAll(filepath.Join(dir, "skills", "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(dir, "outside.md"), filepath.Join(dir, "skills", "a", "SKILL.md")); err != nil {
			t.Fatal(err)
		}
		if _, err := manifest.LoadBundle(dir); !errors.Is(err, manifest.ErrLayout) || !strings.Contains(err.Error(), "regular") {
			t.Fatalf("err = %v", err)
		}
	})
}

// A module must be where wasm_path says, as a regular file.
func TestBundleModule(t *testing.T) {
	dir := writeBundle(t, map[string]string{"manifest.toml": base})
	if _, err := manifest.LoadBundle(dir); !errors.Is(err, manifest.ErrLayout) {
		t.Fatalf("missing module: %v", err)
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "plugin.wasm")); err != nil {
		t.Fatal(err)
	}
	if _, err := manifest.LoadBundle(dir); !errors.Is(err, manifest.ErrLayout) {
		t.Fatalf("symlinked module: %v", err)
	}
}
