package pluginsandbox_test

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/testenv"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// liveBox holds live settings a test changes between scans.
type liveBox struct {
	mu sync.Mutex
	l  pluginsandbox.Live
}

func (b *liveBox) get() pluginsandbox.Live {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.l
}

func (b *liveBox) set(f func(*pluginsandbox.Live)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(&b.l)
}

type testServer struct {
	*pluginsandbox.Server
	live *liveBox
	logs *observer.ObservedLogs
	sink *recordingSink
	dir  string
}

// recordingSink keeps the plugins' own log records.
type recordingSink struct {
	mu      sync.Mutex
	records []wasmhost.LogRecord
}

func (s *recordingSink) WritePluginLog(r wasmhost.LogRecord) {
	s.mu.Lock()
	s.records = append(s.records, r)
	s.mu.Unlock()
}

func (s *recordingSink) messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.records))
	for i, r := range s.records {
		out[i] = r.Message
	}
	return out
}

// newTestServer serves dir with live settings the test controls.
func newTestServer(t testing.TB, dir string, mut ...func(*pluginsandbox.Config)) *testServer {
	t.Helper()
	return newTestServerLimits(t, dir, wasmhost.Limits{}, mut...)
}

// newTestServerLimits is newTestServer with a host of the limits lim (all
// zero: the defaults).
func newTestServerLimits(t testing.TB, dir string, lim wasmhost.Limits, mut ...func(*pluginsandbox.Config)) *testServer {
	t.Helper()
	ctx := context.Background()
	sink := &recordingSink{}
	host, err := wasmhost.New(ctx, wasmhost.Config{CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes, Logger: zap.NewNop(), LogSink: sink, Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	core, logs := observer.New(zapcore.InfoLevel)
	box := &liveBox{l: pluginsandbox.DefaultLive()}
	cfg := pluginsandbox.Config{Host: host, PluginsDir: dir, Logger: zap.New(core), ConfigSource: &wasmhost.MemoryConfig{}, Settings: box.get}
	for _, m := range mut {
		m(&cfg)
	}
	srv, err := pluginsandbox.NewServer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(ctx) })
	return &testServer{Server: srv, live: box, logs: logs, sink: sink, dir: dir}
}

func (ts *testServer) rescan(t *testing.T) {
	t.Helper()
	if err := ts.Rescan(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// plugins returns every plugin (loaded or not) by folder.
func (ts *testServer) plugins(t *testing.T) map[string]*pluginv1.Plugin {
	t.Helper()
	resp, err := ts.ListPlugins(context.Background(), &pluginv1.ListPluginsRequest{All: true})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*pluginv1.Plugin{}
	for _, p := range resp.Plugins {
		out[p.Dir] = p
	}
	return out
}

func (ts *testServer) tools(t *testing.T) []string {
	t.Helper()
	resp, err := ts.ListTools(context.Background(), &pluginv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tl := range resp.Tools {
		out = append(out, tl.Name)
	}
	return out
}

// rewriteManifest edits dir/<folder>/manifest.toml.
func rewriteManifest(t *testing.T, dir, folder string, edit func(string) string) {
	t.Helper()
	p := filepath.Join(dir, folder, "manifest.toml")
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(edit(string(raw))), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Two plugins offering the same tool name are both refused, with a log
// line naming both; removing one lets the other load at the next scan.
func TestToolNameClashRefusesBoth(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "echo")
	installExample(t, dir, "echo")
	if err := os.Rename(filepath.Join(dir, "echo"), filepath.Join(dir, "aaa-echo")); err != nil {
		t.Fatal(err)
	}
	installExample(t, dir, "echo")
	rewriteManifest(t, dir, "aaa-echo", func(s string) string { return strings.Replace(s, `name = "echo"`, `name = "echo-copy"`, 1) })
	ts := newTestServer(t, dir)

	if tools := ts.tools(t); slices.Contains(tools, "wasm_echo") {
		t.Fatalf("a clashing tool is served: %v", tools)
	}
	ps := ts.plugins(t)
	for folder, other := range map[string]string{"aaa-echo": "echo", "echo": "echo-copy"} {
		p := ps[folder]
		if p == nil || p.Status != "refused" || !strings.Contains(p.Reason, "wasm_echo") || !strings.Contains(p.Reason, other) {
			t.Fatalf("%s: %+v", folder, p)
		}
	}
	clash := ts.logs.FilterMessage("tool name offered by several plugins; all refused").All()
	if len(clash) != 1 {
		t.Fatalf("clash log lines: %v", clash)
	}
	if got := clash[0].ContextMap()["plugins"]; !slices.Equal(toStrings(got), []string{"echo", "echo-copy"}) {
		t.Fatalf("the log line names %v", got)
	}
	_, err := ts.ExecuteTool(context.Background(), &pluginv1.ExecuteToolRequest{ToolName: "wasm_echo"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("execute a refused tool: %v", err)
	}

	if err := os.RemoveAll(filepath.Join(dir, "aaa-echo")); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	if tools := ts.tools(t); !slices.Equal(tools, []string{"wasm_echo"}) {
		t.Fatalf("after removing one: %v", tools)
	}
}

func toStrings(v any) []string {
	switch x := v.(type) {
	case []string:
		return x
	case []any:
		out := make([]string, len(x))
		for i, s := range x {
			out[i], _ = s.(string)
		}
		return out
	}
	return nil
}

// Discovery follows the folder: an install, a replacement and a removal
// apply at the next scan, without a new server.
func TestRediscovery(t *testing.T) {
	dir := t.TempDir()
	ts := newTestServer(t, dir)
	if len(ts.tools(t)) != 0 {
		t.Fatal("tools in an empty folder")
	}
	src := t.TempDir()
	installExample(t, src, "echo")
	in := &install.Installer{PluginsDir: dir, Policy: manifest.DefaultPolicy()}
	if _, err := in.InstallPath(context.Background(), filepath.Join(src, "echo")); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	resp, err := ts.ExecuteTool(context.Background(), &pluginv1.ExecuteToolRequest{ToolName: "wasm_echo", ArgumentsJson: `{"text":"hi"}`})
	if err != nil || resp.Output != "hi" {
		t.Fatalf("after install: %v %v", resp, err)
	}
	rewriteManifest(t, filepath.Join(src), "echo", func(s string) string { return strings.Replace(s, "0.1.0", "0.2.0", 1) })
	if _, err := in.InstallPath(context.Background(), filepath.Join(src, "echo")); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	if p := ts.plugins(t)["echo"]; p == nil || p.Version != "0.2.0" || p.Status != "loaded" {
		t.Fatalf("after replace: %+v", p)
	}
	if _, err := in.Remove("echo"); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	if len(ts.plugins(t)) != 0 || len(ts.tools(t)) != 0 {
		t.Fatalf("after remove: %v", ts.plugins(t))
	}

	// Run notices by itself.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ts.Run(ctx, 20*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	if _, err := in.InstallPath(context.Background(), filepath.Join(src, "echo")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(ts.tools(t), "wasm_echo") {
		if time.Now().After(deadline) {
			t.Fatal("Run never loaded the installed plugin")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The signature policy at discovery: strict loads only trusted plugins
// (the others are skipped, the host keeps going), permissive loads all
// with a warning, disabled checks nothing; a policy change applies at the
// next scan. ListPlugins says signed only for a verified signature.
func TestSignaturePolicyAtDiscovery(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "echo")
	installExample(t, dir, "misbehave")
	pub := signExample(t, dir, "echo", "k")
	ts := newTestServer(t, dir)
	ts.live.set(func(l *pluginsandbox.Live) {
		l.Policy = manifest.Policy{Mode: manifest.ModeStrict, Trusted: []string{pub}}
	})
	ts.rescan(t)
	ps := ts.plugins(t)
	if p := ps["echo"]; p.Status != "loaded" || !p.Signed || p.Publisher != pub || p.SignatureStatus != "trusted" {
		t.Fatalf("strict, trusted: %+v", p)
	}
	if p := ps["misbehave"]; p.Status != "refused" || p.SignatureStatus != "unsigned" || p.Signed {
		t.Fatalf("strict, unsigned: %+v", p)
	}

	// Tampering with the signed manifest: refused in strict.
	rewriteManifest(t, dir, "echo", func(s string) string { return strings.Replace(s, "Returns the text", "Steals the text", 1) })
	ts.rescan(t)
	if p := ts.plugins(t)["echo"]; p.Status != "refused" || p.SignatureStatus != "invalid" || p.Signed {
		t.Fatalf("strict, tampered: %+v", p)
	}
	// Permissive: everything loads, with a warning for each.
	const warning = "plugin signature not verified; loading it (signature_mode permissive)"
	before := ts.logs.FilterMessage(warning).Len()
	ts.live.set(func(l *pluginsandbox.Live) { l.Policy.Mode = manifest.ModePermissive })
	ts.rescan(t)
	if got := ts.tools(t); !slices.Equal(got, []string{"misbehave", "wasm_echo"}) {
		t.Fatalf("permissive tools %v", got)
	}
	if n := ts.logs.FilterMessage(warning).Len() - before; n != 2 {
		t.Fatalf("%d permissive warnings, want 2", n)
	}
	ts.live.set(func(l *pluginsandbox.Live) { l.Policy.Mode = manifest.ModeDisabled })
	ts.rescan(t)
	if p := ts.plugins(t)["echo"]; p.Status != "loaded" || p.SignatureStatus != "unchecked" || p.Signed {
		t.Fatalf("disabled: %+v", p)
	}
	// plugins.enabled = false unloads everything.
	ts.live.set(func(l *pluginsandbox.Live) { l.Enabled = false })
	ts.rescan(t)
	resp, _ := ts.ListPlugins(context.Background(), &pluginv1.ListPluginsRequest{All: true})
	if resp.Enabled || len(resp.Plugins) != 0 || len(ts.tools(t)) != 0 {
		t.Fatalf("disabled system: %+v", resp)
	}
}

// Skill bundles: discovered, namespaced plugin:<plugin>/<skill>, readable;
// a bundle whose skill lacks description is refused at discovery.
func TestSkillBundlesDiscovered(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("toolkit/manifest.toml", "name = \"toolkit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n")
	write("toolkit/skills/design-review/SKILL.md", "---\nname: design-review\ndescription: Reviews designs.\n---\n# Steps\n")
	write("toolkit/skills/design-review/references/checklist.md", "- is it simple?\n")
	write("broken/manifest.toml", "name = \"broken\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n")
	write("broken/skills/x/SKILL.md", "---\nname: x\n---\n")
	ts := newTestServer(t, dir)
	ctx := context.Background()
	skills, err := ts.ListSkills(ctx, &pluginv1.ListSkillsRequest{})
	if err != nil || len(skills.Skills) != 1 || skills.Skills[0].Id != "plugin:toolkit/design-review" || skills.Skills[0].Description != "Reviews designs." {
		t.Fatalf("skills: %v %v", skills, err)
	}
	if p := ts.plugins(t)["broken"]; p.Status != "failed" || !strings.Contains(p.Reason, "description") {
		t.Fatalf("bundle without description: %+v", p)
	}
	got, err := ts.ReadSkill(ctx, &pluginv1.ReadSkillRequest{Id: "plugin:toolkit/design-review"})
	if err != nil || !strings.Contains(got.Content, "# Steps") {
		t.Fatalf("read: %v %v", got, err)
	}
	got, err = ts.ReadSkill(ctx, &pluginv1.ReadSkillRequest{Id: "plugin:toolkit/design-review", Path: "references/checklist.md"})
	if err != nil || got.Content != "- is it simple?\n" {
		t.Fatalf("read reference: %v %v", got, err)
	}
	for _, bad := range []string{"../../broken/manifest.toml", "/etc/passwd", "references/../SKILL.md"} {
		if _, err := ts.ReadSkill(ctx, &pluginv1.ReadSkillRequest{Id: "plugin:toolkit/design-review", Path: bad}); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("path %q: %v", bad, err)
		}
	}
	if _, err := ts.ReadSkill(ctx, &pluginv1.ReadSkillRequest{Id: "plugin:broken/x"}); status.Code(err) != codes.NotFound {
		t.Fatalf("refused bundle readable: %v", err)
	}
}

// A signed skill bundle's files are covered by its signature
// (skills_sha256): under strict, a file changed after the load is not
// served in the publisher's name, and the next scan fails the plugin.
// Before, ReadSkill served whatever the folder held and the plugin kept
// loading as trusted: the signature covered its manifest alone.
func TestSignatureCoversSkillFilesAtDiscovery(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, body string) { t.Helper(); testenv.WriteFile(t, dir, rel, body) }
	text := "name = \"kit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n"
	write("kit/skills/review/SKILL.md", "---\nname: review\ndescription: Reviews.\n---\nRead it.\n")
	write("kit/skills/review/references/guide.md", "Be kind.\n")
	m, err := manifest.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	b, err := manifest.BundleOf(filepath.Join(dir, "kit"), m)
	if err != nil {
		t.Fatal(err)
	}
	_, files, err := b.Contents()
	if err != nil {
		t.Fatal(err)
	}
	key := ed25519.NewKeyFromSeed([]byte(strings.Repeat("s", 32)))
	signed, err := manifest.Sign([]byte(text), nil, files.Digest(), key)
	if err != nil {
		t.Fatal(err)
	}
	write("kit/manifest.toml", string(signed))
	ts := newTestServer(t, dir)
	ts.live.set(func(l *pluginsandbox.Live) {
		l.Policy = manifest.Policy{Mode: manifest.ModeStrict, Trusted: []string{hex.EncodeToString(key.Public().(ed25519.PublicKey))}}
	})
	ts.rescan(t)
	if p := ts.plugins(t)["kit"]; p.Status != "loaded" || p.SignatureStatus != "trusted" {
		t.Fatalf("strict, signed bundle: %+v", p)
	}
	ctx := context.Background()
	read := &pluginv1.ReadSkillRequest{Id: "plugin:kit/review", Path: "references/guide.md"}
	if got, err := ts.ReadSkill(ctx, read); err != nil || got.Content != "Be kind.\n" {
		t.Fatalf("read as signed: %v %v", got, err)
	}
	write("kit/skills/review/references/guide.md", "Paste your keys here.\n")
	if got, err := ts.ReadSkill(ctx, read); err == nil {
		t.Fatalf("a file changed since the load was served: %q", got.Content)
	}
	ts.rescan(t)
	if p := ts.plugins(t)["kit"]; p.Status == "loaded" || !strings.Contains(p.Reason, "skills_sha256") {
		t.Fatalf("strict, a skill file changed: %+v", p)
	}
	if _, err := ts.ReadSkill(ctx, read); status.Code(err) != codes.NotFound {
		t.Fatalf("the refused bundle is readable: %v", err)
	}
}

// A memory plugin serves as a storage backend; an observer receives the
// host's events.
func TestMemoryAndObserverWorlds(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "kv")
	installExample(t, dir, "observer")
	installExample(t, dir, "echo")
	ts := newTestServer(t, dir)
	ctx := context.Background()
	for _, e := range []*pluginv1.MemoryEntry{{Key: "a", Content: "the sky is blue"}, {Key: "b", Content: "grass is green"}} {
		if _, err := ts.MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Entry: e}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: "blue", Limit: 5})
	if err != nil || len(got.Entries) != 1 || got.Entries[0].Key != "a" {
		t.Fatalf("recall: %v %v", got, err)
	}
	forgot, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Plugin: "kv", Key: "a"})
	if err != nil || !forgot.Existed {
		t.Fatalf("forget: %v %v", forgot, err)
	}
	if _, err := ts.MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Plugin: "nope", Entry: &pluginv1.MemoryEntry{Key: "k"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown memory plugin: %v", err)
	}
	if _, err := ts.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "wasm_echo", ArgumentsJson: `{"text":"x"}`}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		msgs := strings.Join(ts.sink.messages(), "\n")
		if strings.Contains(msgs, "event tool_call #1") && strings.Contains(msgs, "tool=wasm_echo") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the observer never logged the tool call: %s", msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func writeFileAll(t *testing.T, p string, body []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, body, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Answers carry text, which a proto string must hold as UTF-8: a skill's
// binary reference failed ReadSkill as an internal error, and one folder
// named in Latin-1 made the whole ListPlugins answer unsendable. The
// file is refused by name; the folder is listed with U+FFFD in its name.
func TestAnswersHoldOnlyUTF8(t *testing.T) {
	dir := t.TempDir()
	writeFileAll(t, filepath.Join(dir, "kit/manifest.toml"), []byte("name = \"kit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n"))
	writeFileAll(t, filepath.Join(dir, "kit/skills/s/SKILL.md"), []byte("---\nname: s\ndescription: d\n---\n"))
	writeFileAll(t, filepath.Join(dir, "kit/skills/s/references/logo.png"), []byte("\x89PNG\r\n\x1a\n\xff\xfe"))
	if err := os.Mkdir(filepath.Join(dir, "caf\xe9"), 0o755); err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, dir)
	_, err := ts.ReadSkill(context.Background(), &pluginv1.ReadSkillRequest{Id: "plugin:kit/s", Path: "references/logo.png"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "`references/logo.png` is not UTF-8 text") {
		t.Fatalf("ReadSkill of a binary file: %v", err)
	}
	resp, err := ts.ListPlugins(context.Background(), &pluginv1.ListPluginsRequest{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proto.Marshal(resp); err != nil {
		t.Fatalf("the ListPlugins answer cannot be sent: %v", err)
	}
	found := false
	for _, p := range resp.GetPlugins() {
		found = found || strings.HasSuffix(p.GetDir(), "caf\uFFFD")
	}
	if !found {
		t.Fatalf("the folder is not listed: %v", resp.GetPlugins())
	}
}

// A plugin runs with the grants its manifest asks for, so a plugin folder
// another user could write (a file writable by all, or owned by someone
// else) is refused, naming the file, and loads again once it is safe; a
// plugins folder another user could fill loads nothing at all.
func TestPluginFilesOthersCouldChangeAreRefused(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "echo")
	ts := newTestServer(t, dir)
	if tools := ts.tools(t); !slices.Equal(tools, []string{"wasm_echo"}) {
		t.Fatalf("tools at start: %v", tools)
	}
	manifestPath := filepath.Join(dir, "echo", "manifest.toml")
	refused := func(want string) {
		t.Helper()
		p := ts.plugins(t)["echo"]
		if p == nil || p.Status != "failed" || !strings.Contains(p.Reason, want) {
			t.Fatalf("plugin %+v, want failed with %q", p, want)
		}
		if tools := ts.tools(t); len(tools) != 0 {
			t.Fatalf("a refused plugin's tools are served: %v", tools)
		}
	}
	loaded := func() {
		t.Helper()
		if p := ts.plugins(t)["echo"]; p == nil || p.Status != "loaded" {
			t.Fatalf("plugin %+v, want loaded", p)
		}
	}

	// Made writable by all, then changed (by anyone): refused.
	if err := os.Chmod(manifestPath, 0o666); err != nil {
		t.Fatal(err)
	}
	rewriteManifest(t, dir, "echo", func(s string) string { return s + "\n# changed\n" })
	ts.rescan(t)
	refused(manifestPath + " is writable by others (mode 0666")
	// Its owner takes the write bit back: the next scan loads it, though
	// no byte changed.
	if err := os.Chmod(manifestPath, 0o644); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	loaded()

	// A folder inside writable by all.
	wasmDir := filepath.Join(dir, "echo", "sub")
	if err := os.Mkdir(wasmDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(wasmDir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	rewriteManifest(t, dir, "echo", func(s string) string { return s + "\n# again\n" })
	ts.rescan(t)
	refused(wasmDir + " is writable by others")
	if err := os.Remove(wasmDir); err != nil {
		t.Fatal(err)
	}
	rewriteManifest(t, dir, "echo", func(s string) string { return s + "\n# and again\n" })
	ts.rescan(t)
	loaded()

	if os.Geteuid() == 0 {
		// Owned by another user.
		if err := os.Chown(manifestPath, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		rewriteManifest(t, dir, "echo", func(s string) string { return s + "\n# theirs\n" })
		ts.rescan(t)
		refused(manifestPath + " belongs to another user (uid 4242)")
		if err := os.Chown(manifestPath, 0, 0); err != nil {
			t.Fatal(err)
		}
		ts.rescan(t)
		loaded()
	}

	// The plugins folder itself writable by all: nothing loads, and what
	// was loaded is unloaded; made safe again, the plugin is back.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := ts.Rescan(context.Background()); err == nil || !strings.Contains(err.Error(), "plugins dir refused") || !strings.Contains(err.Error(), dir+" is writable by others") {
		t.Fatalf("scan of a plugins folder writable by all: %v", err)
	}
	if tools := ts.tools(t); len(tools) != 0 {
		t.Fatalf("tools served from a plugins folder writable by all: %v", tools)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	if tools := ts.tools(t); !slices.Equal(tools, []string{"wasm_echo"}) {
		t.Fatalf("tools once the folder is safe: %v", tools)
	}
}

// A module swapped after a signed plugin was installed is refused at the
// next scan in strict mode: the signature covers the module's bytes, not
// only the manifest. Before, echo's trusted signature loaded misbehave's
// code under echo's name.
func TestSignatureCoversModuleAtDiscovery(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "echo")
	installExample(t, dir, "misbehave")
	pub := signExample(t, dir, "echo", "m")
	ts := newTestServer(t, dir)
	ts.live.set(func(l *pluginsandbox.Live) {
		l.Policy = manifest.Policy{Mode: manifest.ModeStrict, Trusted: []string{pub}}
	})
	ts.rescan(t)
	if p := ts.plugins(t)["echo"]; p.Status != "loaded" || p.SignatureStatus != "trusted" {
		t.Fatalf("strict, trusted: %+v", p)
	}
	other, err := os.ReadFile(filepath.Join(dir, "misbehave", "plugin.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "echo", "plugin.wasm"), other, 0o644); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	if p := ts.plugins(t)["echo"]; p.Status != "failed" || !strings.Contains(p.Reason, "module") {
		t.Fatalf("strict, module swapped: %+v", p)
	}
	// A module its manifest's wasm_sha256 does not match fails in every
	// mode, signed or not: permissive loaded the signed one with a
	// warning, and any mode the unsigned one.
	mf := filepath.Join(dir, "misbehave", "manifest.toml")
	raw, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	wrong := "wasm_sha256 = \"" + manifest.ModuleDigest([]byte("another module")) + "\"\n"
	if err := os.WriteFile(mf, append([]byte(wrong), raw...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []manifest.Mode{manifest.ModePermissive, manifest.ModeDisabled} {
		ts.live.set(func(l *pluginsandbox.Live) { l.Policy.Mode = mode })
		ts.rescan(t)
		for _, name := range []string{"echo", "misbehave"} {
			if p := ts.plugins(t)[name]; p.Status != "failed" || !strings.Contains(p.Reason, "wasm_sha256") {
				t.Fatalf("%s, %s whose module does not match wasm_sha256: %+v", mode, name, p)
			}
		}
	}
}

// signExample signs the installed plugin name (manifest and module) with
// the key of seed (one byte, repeated) and returns its public key.
func signExample(t *testing.T, dir, name, seed string) string {
	t.Helper()
	key := ed25519.NewKeyFromSeed([]byte(strings.Repeat(seed, 32)))
	mf := filepath.Join(dir, name, "manifest.toml")
	raw, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	module, err := os.ReadFile(filepath.Join(dir, name, "plugin.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	signed, err := manifest.Sign(raw, module, "", key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mf, signed, 0o644); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(key.Public().(ed25519.PublicKey))
}
