package pluginsandbox_test

import (
	"context"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testenv"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// TestRescanParsesOnlyChangedManifests: a scan parses a folder's manifest
// again only when its bytes changed, whether it was accepted or refused
// (a manifest can cost far more to parse than to read), and still notices
// a change to the files the manifest names.
func TestRescanParsesOnlyChangedManifests(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, body string) { t.Helper(); testenv.WriteFile(t, dir, rel, body) }
	write("kit/manifest.toml", "name = \"kit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n")
	write("kit/skills/s/SKILL.md", "---\nname: s\ndescription: first\n---\n")
	write("refused/manifest.toml", "name = \"refused\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\ncolour = \"red\"\n")
	parses, undo := pluginsandbox.CountManifestParses()
	defer undo()

	ts := newTestServer(t, dir)
	if n := parses(); n != 2 {
		t.Fatalf("first scan parsed %d manifests, want 2", n)
	}
	ts.rescan(t)
	ts.rescan(t)
	if n := parses(); n != 2 {
		t.Fatalf("two scans with nothing changed parsed %d more manifests, want none", n-2)
	}

	// A changed skill file reloads the plugin without parsing its
	// unchanged manifest in the fingerprint.
	write("kit/skills/s/SKILL.md", "---\nname: s\ndescription: second, longer\n---\n")
	ts.rescan(t)
	skills, err := ts.ListSkills(context.Background(), &pluginv1.ListSkillsRequest{})
	if err != nil || len(skills.Skills) != 1 || skills.Skills[0].Description != "second, longer" {
		t.Fatalf("changed skill not reloaded: %v %v", skills, err)
	}
	if n := parses(); n != 2 {
		t.Fatalf("a changed skill file made the fingerprint parse %d manifests, want none", n-2)
	}

	write("refused/manifest.toml", "name = \"refused\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\ncolour = \"blue\"\n")
	ts.rescan(t)
	if n := parses(); n != 3 {
		t.Fatalf("one changed manifest: %d parses in all, want 3", n)
	}
}
