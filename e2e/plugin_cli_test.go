package e2e_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// cli runs the stack's clawmesh binary against it and returns its output.
func cli(t *testing.T, s *e2e.Stack, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.BinDir, "clawmesh"), args...)
	cmd.Env = append(os.Environ(), "ZEROCLAW_CONFIG_DIR="+s.DataDir, "ZEROCLAW_SOCKET="+s.Socket, "ZEROCLAW_TOKEN=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustCLI(t *testing.T, s *e2e.Stack, args ...string) string {
	t.Helper()
	out, err := cli(t, s, args...)
	if err != nil {
		t.Fatalf("clawmesh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// toolWorks reports whether a probe turn's tool call returned want.
func toolWorks(t *testing.T, v *conv, session, tool, args, want string) bool {
	t.Helper()
	_, results, _ := toolTurn(t, v, session, "/tool "+tool+" "+args)
	return len(results) == 1 && results[0].Status == "completed" && results[0].RawOutput == want
}

// copyExample builds an example plugin into a fresh folder, optionally
// renamed, as an author's working copy.
func copyExample(t *testing.T, name, rename string) string {
	t.Helper()
	base := t.TempDir()
	if err := guestbuild.Install(base, name); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, name)
	if rename != "" {
		mf := filepath.Join(dir, "manifest.toml")
		raw, _ := os.ReadFile(mf)
		raw = []byte(strings.Replace(string(raw), `name = "`+name+`"`, `name = "`+rename+`"`, 1))
		if err := os.WriteFile(mf, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// skillRegistry publishes a skill bundle as a zip in a file:// registry.
func skillRegistry(t *testing.T) string {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range map[string]string{
		"toolkit/manifest.toml":                 "name = \"toolkit\"\nversion = \"1.2.0\"\ndescription = \"Review skills\"\ncapabilities = [\"skill\"]\n",
		"toolkit/skills/design-review/SKILL.md": "---\nname: design-review\ndescription: Reviews a design.\n---\nStep one: read it.\n",
	} {
		w, _ := zw.Create(name)
		_, _ = w.Write([]byte(body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "toolkit-1.2.0.zip"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	index, _ := json.Marshal(map[string]any{"plugins": []map[string]any{{
		"name": "toolkit", "version": "1.2.0", "description": "Design and code review skills", "author": "e2e",
		"capabilities": []string{"skill"}, "url": "toolkit-1.2.0.zip", "sha256": "sha256:" + hex.EncodeToString(sum[:]),
	}}})
	if err := os.WriteFile(filepath.Join(dir, "registry.json"), index, 0o644); err != nil {
		t.Fatal(err)
	}
	return (&url.URL{Scheme: "file", Path: filepath.Join(dir, "registry.json")}).String()
}

// An operator searches a registry, installs, signs, configures and removes
// plugins with the CLI, under the signature policy, and the running stack
// follows without a restart; a second plugin offering the same tool name
// refuses both.
func TestPluginCLIWithoutRestart(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, nil, "--set", "plugins.scan_interval_ms=200")
	v := newConv(t, s, nil)
	sandboxPID := s.PIDOf("plugin-sandbox")
	probe := v.newSession("")

	// The examples installed below are compiled into the stack's cache
	// beforehand: what is tested is the CLI and the stack following it,
	// not the sandbox's compile of each.
	seedExamples(t, s.DataDir, "echo", "misbehave")

	// Install from a local folder; the install seeds the tool's entry.
	echo := copyExample(t, "echo", "")
	out := mustCLI(t, s, "plugin", "install", echo)
	key := regexp.MustCompile(`tool instance key: (zpi1_[0-9a-f]+)`).FindStringSubmatch(out)
	if key == nil || !strings.Contains(out, "seeded plugins.entries."+key[1]+".config") {
		t.Fatalf("install output:\n%s", out)
	}
	if info := mustCLI(t, s, "plugin", "info", "echo"); !strings.Contains(info, "tool key:      "+key[1]) {
		t.Fatalf("info:\n%s", info)
	}
	waitFor(t, "the installed tool", 60*time.Second, func() bool { return toolWorks(t, v, probe, echoTool, `{"text":"one"}`, "one") })

	// A second plugin offering wasm_echo: both refused, never first-come.
	mustCLI(t, s, "plugin", "install", copyExample(t, "echo", "echo-twin"))
	waitFor(t, "the clash to refuse both", 60*time.Second, func() bool {
		refused := 0
		for _, p := range listPlugins(t, v).Plugins {
			if p["status"] == "refused" && strings.Contains(p["reason"].(string), "wasm_echo") {
				refused++
			}
		}
		return refused == 2
	})
	if _, results, _ := toolTurn(t, v, probe, "/tool "+echoTool+` {"text":"x"}`); len(results) != 1 || results[0].Status != "failed" {
		t.Fatalf("a clashing tool was served: %+v", results)
	}
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if l := readLog(t, s, "plugin-sandbox"); !regexp.MustCompile(`tool name offered by several plugins; all refused.*"echo","echo-twin"`).MatchString(l) {
			return errors.New("no log line names both plugins of the clash")
		}
		return nil
	})
	if list := mustCLI(t, s, "plugin", "list"); !strings.Contains(list, "echo-twin") || !strings.Contains(list, "refused") {
		t.Fatalf("plugin list:\n%s", list)
	}
	mustCLI(t, s, "plugin", "remove", "echo-twin")
	waitFor(t, "echo back after the twin's removal", 60*time.Second, func() bool { return toolWorks(t, v, probe, echoTool, `{"text":"two"}`, "two") })

	// Strict signatures: an unsigned plugin is refused at install; signed
	// by a trusted key it installs.
	keyFile := filepath.Join(t.TempDir(), "publisher.key")
	gen := mustCLI(t, s, "plugin", "keygen", "--out", keyFile)
	pub := regexp.MustCompile(`public key: ([0-9a-f]{64})`).FindStringSubmatch(gen)
	if pub == nil {
		t.Fatalf("keygen:\n%s", gen)
	}
	mustCLI(t, s, "config", "set", "plugins.security.signature_mode=strict", "plugins.security.trusted_publisher_keys="+pub[1])
	misbehave := copyExample(t, "misbehave", "")
	if out, err := cli(t, s, "plugin", "install", misbehave); err == nil || !strings.Contains(out, "signature refused") {
		t.Fatalf("strict install of an unsigned plugin: %v\n%s", err, out)
	}
	mustCLI(t, s, "plugin", "sign", "--key", keyFile, misbehave)
	if out := mustCLI(t, s, "plugin", "install", misbehave); !strings.Contains(out, "signature: trusted") {
		t.Fatalf("signed install:\n%s", out)
	}
	// The unsigned echo is now refused by discovery in strict mode.
	waitFor(t, "strict mode to refuse the unsigned echo", 60*time.Second, func() bool {
		for _, p := range listPlugins(t, v).Plugins {
			if p["name"] == "echo" {
				return p["status"] == "refused" && p["signature_status"] == "unsigned"
			}
		}
		return false
	})
	mustCLI(t, s, "config", "set", "plugins.security.signature_mode=permissive")

	// Search and install a skill bundle from a file:// registry; the
	// session service reads it.
	reg := skillRegistry(t)
	if found := mustCLI(t, s, "plugin", "search", "review", "--registry", reg); !strings.Contains(found, "toolkit") || !strings.Contains(found, "1.2.0") {
		t.Fatalf("search:\n%s", found)
	}
	if out := mustCLI(t, s, "plugin", "install", "toolkit@1.2.0", "--registry", reg); !strings.Contains(out, "installed toolkit 1.2.0") {
		t.Fatalf("registry install:\n%s", out)
	}
	waitFor(t, "the skill to be readable in a turn", 60*time.Second, func() bool {
		_, results, _ := toolTurn(t, v, probe, `/tool plugin_skill_read {"id":"plugin:toolkit/design-review"}`)
		return len(results) == 1 && strings.Contains(results[0].RawOutput, "Step one: read it.")
	})

	// Remove: the tool goes away, still without a restart.
	mustCLI(t, s, "plugin", "remove", "echo", "--purge")
	waitFor(t, "echo to disappear", 60*time.Second, func() bool {
		for _, p := range listPlugins(t, v).Plugins {
			if p["name"] == "echo" {
				return false
			}
		}
		return true
	})
	if pid := s.PIDOf("plugin-sandbox"); pid != sandboxPID {
		t.Fatalf("the sandbox restarted (pid %d, then %d)", sandboxPID, pid)
	}
}
