package pluginsandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// writeSkillKit writes a skill plugin kit of version at dir, with the
// one skill named skill; with digest its manifest carries the
// skills_sha256 of its files.
func writeSkillKit(t *testing.T, dir, version, skill string, digest bool) {
	t.Helper()
	p := filepath.Join(dir, "skills", skill, "SKILL.md")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("---\nname: "+skill+"\ndescription: Version "+version+".\n---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	text := "name = \"kit\"\nversion = \"" + version + "\"\ncapabilities = [\"skill\"]\n"
	if digest {
		m, err := manifest.Parse([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		b, err := manifest.BundleOf(dir, m)
		if err != nil {
			t.Fatal(err)
		}
		_, files, err := b.Contents()
		if err != nil {
			t.Fatal(err)
		}
		text += fmt.Sprintf("skills_sha256 = %q\n", files.Digest())
	}
	if err := os.WriteFile(filepath.Join(dir, manifest.FileName), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An upgrade that swaps a plugin's folder while a scan reads it (here
// between the manifest's read and the reads of the files it names, as
// the hook puts it) loads the new version whole. Before, the scan loaded
// the old manifest with the new files: without digests, kit 1.0.0
// offering version 2's skill; with skills_sha256, a failure ("its files
// do not match skills_sha256") that kept the plugin unavailable until
// the next scan.
func TestUpgradeDuringLoadLoadsOneVersion(t *testing.T) {
	for _, digest := range []bool{false, true} {
		t.Run(fmt.Sprintf("digest=%v", digest), func(t *testing.T) {
			dir := t.TempDir()
			writeSkillKit(t, filepath.Join(dir, "kit"), "1.0.0", "one", digest)
			ts := newTestServer(t, dir)
			if p := ts.plugins(t)["kit"]; p.GetStatus() != "loaded" || p.GetVersion() != "1.0.0" {
				t.Fatalf("version 1: %+v", p)
			}
			src := filepath.Join(t.TempDir(), "kit")
			writeSkillKit(t, src, "2.0.0", "two", digest)
			in := &install.Installer{PluginsDir: dir, Policy: manifest.DefaultPolicy()}
			swapped := false
			undo := pluginsandbox.SetLoadHook(func(string) {
				if swapped {
					return
				}
				swapped = true
				if res, err := in.InstallPath(context.Background(), src); err != nil || !res.Replaced {
					t.Errorf("upgrade: %+v %v", res, err)
				}
			})
			defer undo()
			// The manifest's bytes change, so the scan reads it anew.
			rewriteManifest(t, dir, "kit", func(s string) string { return s + "# touched\n" })
			ts.rescan(t)
			if !swapped {
				t.Fatal("the hook never ran")
			}
			p := ts.plugins(t)["kit"]
			skills, err := ts.ListSkills(context.Background(), &pluginv1.ListSkillsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sk := range skills.Skills {
				ids = append(ids, sk.Id)
			}
			if p.GetStatus() != "loaded" || p.GetVersion() != "2.0.0" || !slices.Equal(ids, []string{"plugin:kit/two"}) {
				t.Fatalf("after an upgrade during the load: status %q version %q reason %q skills %v; want loaded 2.0.0 [plugin:kit/two]",
					p.GetStatus(), p.GetVersion(), p.GetReason(), strings.Join(ids, ","))
			}
		})
	}
}

// A plugin copied in by hand is not bounded by an install's 10,000
// entries: every scan's fingerprint walked its whole skills/ tree, and
// its load read it all before refusing it. Now the fingerprint looks at
// no more than the bound allows (and reads no folder past it), and the
// plugin is refused, saying the bound.
func TestSkillTreePastTheBoundIsRefusedWithoutWalkingIt(t *testing.T) {
	dir := t.TempDir()
	writeSkillKit(t, filepath.Join(dir, "kit"), "1.0.0", "one", false)
	refs := filepath.Join(dir, "kit", "skills", "one", "refs")
	if err := os.Mkdir(refs, 0o755); err != nil {
		t.Fatal(err)
	}
	const extra = 500
	for i := range manifest.MaxSkillTreeFiles + extra {
		if err := os.WriteFile(filepath.Join(refs, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stats, undo := pluginsandbox.CountFingerprintStats()
	defer undo()
	ts := newTestServer(t, dir)
	p := ts.plugins(t)["kit"]
	if p.GetStatus() != "failed" || !strings.Contains(p.GetReason(), fmt.Sprintf("more than %d files and folders", manifest.MaxSkillTreeFiles)) {
		t.Fatalf("a skills/ tree past the bound: status %q reason %q", p.GetStatus(), p.GetReason())
	}
	first := stats()
	ts.rescan(t)
	if n := stats() - first; n > manifest.MaxSkillTreeFiles+2 {
		t.Fatalf("a scan looked at %d files of a plugin whose skills/ holds %d; want at most %d", n, manifest.MaxSkillTreeFiles+extra+4, manifest.MaxSkillTreeFiles+2)
	}
	if p := ts.plugins(t)["kit"]; p.GetStatus() != "failed" {
		t.Fatalf("refused plugin after a rescan: %+v", p)
	}
}

// Where the file system cannot exchange two folders in one step, an
// upgrade renames the installed folder aside (install.ReplacedPrefix),
// then the new one into place. A scan between the two renames found the
// plugin gone and unloaded it: its tools and skills were missing until
// the next scan, a whole scan interval. The scan now keeps serving the
// version it loaded while the folder is moved aside, and scans again
// soon, which loads the new version once it is in place.
func TestHalfSwappedUpgradeKeepsTheOldVersion(t *testing.T) {
	dir := t.TempDir()
	writeSkillKit(t, filepath.Join(dir, "kit"), "1.0.0", "one", false)
	ts := newTestServer(t, dir)
	staged := filepath.Join(dir, install.StagingPrefix+"test")
	writeSkillKit(t, staged, "2.0.0", "two", false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ts.Run(ctx, time.Hour) // scans when kicked only
	}()
	defer func() { cancel(); <-done }()

	if err := os.Rename(filepath.Join(dir, "kit"), filepath.Join(dir, install.ReplacedPrefix+"test")); err != nil {
		t.Fatal(err)
	}
	ts.Kick()
	waitFor(t, "the scan of the folder moved aside", func() bool {
		return ts.logs.FilterMessageSnippet("moved aside").Len() > 0 || ts.logs.FilterMessage("plugin unloaded").Len() > 0
	})
	if p := ts.plugins(t)["kit"]; p.GetStatus() != "loaded" || p.GetVersion() != "1.0.0" {
		t.Fatalf("kit while its folder is moved aside: %+v, want 1.0.0 loaded", p)
	}
	if err := os.Rename(staged, filepath.Join(dir, "kit")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, install.ReplacedPrefix+"test")); err != nil {
		t.Fatal(err)
	}
	// No kick: the scan the half swap asked for loads version 2.
	waitFor(t, "kit 2.0.0", func() bool {
		p := ts.plugins(t)["kit"]
		return p.GetStatus() == "loaded" && p.GetVersion() == "2.0.0"
	})
}

// waitFor polls cond until it holds, failing the test after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30 s", what)
		}
	}
}
