package pluginsandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/trust"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// entry is one plugin folder as one scan found it. It is immutable once
// loaded; a changed folder gets a new entry and the old one is unloaded
// once its running calls end.
type entry struct {
	dir  string // folder name under the plugins directory
	path string
	fp   string // fingerprint of what was loaded
	// parsed is the manifest fingerprint parsed, for the next scan's
	// fingerprint to reuse while the bytes stay the same.
	parsed parsedManifest

	bundle  *manifest.Bundle // nil when the manifest or layout was refused
	err     error            // manifest, layout or module failure
	verdict manifest.Verdict
	policy  error // refused by the signature policy

	tool     *wasmhost.Tool
	memory   *wasmhost.Memory
	ledger   *ledger // the memory plugin's entries, given back to a rebuilt instance
	observer *observerRun
	wasm     []byte // kept for channel bindings, which load per alias

	// mu guards the call references: calls count the running calls;
	// unload sets closed, so no call starts after it, then waits for
	// idle (made when calls are running) before it closes the worlds.
	mu     sync.Mutex
	calls  int
	closed bool
	idle   chan struct{}
}

func (e *entry) name() string {
	if e.bundle == nil {
		return ""
	}
	return e.bundle.Manifest.Name
}

// usable reports whether the entry loaded and passed the policy.
func (e *entry) usable() bool { return e.bundle != nil && e.err == nil && e.policy == nil }

// acquire takes a call reference; false once the entry is unloaded or
// being unloaded, when the catalog holds what replaced it already. It
// never waits: with a read lock, a call that looked the entry up just
// before an upgrade's scan waited behind the unload for the longest
// running call, then failed as an unknown tool.
func (e *entry) acquire() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.calls++
	return true
}

func (e *entry) release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.calls--; e.calls == 0 && e.idle != nil {
		close(e.idle)
		e.idle = nil
	}
}

// unload waits for running calls, then closes every loaded world.
func (e *entry) unload(ctx context.Context) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	var idle chan struct{}
	if e.calls > 0 {
		idle = make(chan struct{})
		e.idle = idle
	}
	e.mu.Unlock()
	if idle != nil {
		<-idle
	}
	e.closeWorlds(ctx)
}

// closeWorlds closes what is loaded. The fields stay set (readers of an
// older catalog may still look at them); closed says they are gone.
func (e *entry) closeWorlds(ctx context.Context) {
	if e.tool != nil {
		_ = e.tool.Close(ctx)
	}
	if e.memory != nil {
		_ = e.memory.Close(ctx)
	}
	if e.ledger != nil {
		e.ledger.journal.close()
	}
	if e.observer != nil {
		e.observer.stop(ctx)
	}
}

// catalog is what one scan decided: every entry, and the tables calls
// read. It is replaced whole, never changed.
type catalog struct {
	live     Live
	entries  []*entry
	refusals map[*entry]string // conflicts found by this scan
	tools    map[string]*entry // by tool name
	memories map[string]*entry // by plugin name
	channels map[string]*entry // channel plugins, by plugin name
	skills   map[string]manifest.Skill
	skillIDs []string
}

func (c *catalog) active(e *entry) bool { return e.usable() && c.refusals[e] == "" }

// Rescan reads the plugins directory and applies what changed: new and
// changed folders are loaded (and checked against the signature policy),
// removed ones unloaded, conflicts refused, channel bindings reconciled.
// A plugin that fails is logged and skipped; the scan goes on. Scans are
// serialised; calls keep being served from the previous catalog until the
// new one replaces it.
func (s *Server) Rescan(ctx context.Context) error {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	live := DefaultLive()
	if s.cfg.Settings != nil {
		live = s.cfg.Settings()
	}
	old := s.current()
	next := &catalog{live: live, refusals: map[*entry]string{}}
	var scanErr error
	s.movedAside = false
	if live.Enabled {
		next.entries, scanErr = s.scanEntries(ctx, old, live)
	}
	if s.movedAside {
		// An upgrade is between its two renames: the scan after the
		// second loads the new version. A few, further apart each, in
		// case the install was killed between them.
		if s.asideScans++; s.asideScans <= maxAsideScans {
			time.AfterFunc(time.Duration(s.asideScans)*asideRescan, s.Kick)
		}
	} else {
		s.asideScans = 0
	}
	s.resolve(next)
	release := s.handOverMemories(ctx, old, next)
	s.mu.Lock()
	s.cat = next
	s.mu.Unlock()
	release()

	kept := map[*entry]bool{}
	for _, e := range next.entries {
		kept[e] = true
	}
	for _, e := range old.entries {
		if !kept[e] {
			s.logger.Info("plugin unloaded", zap.String("dir", e.dir), zap.String("plugin", e.name()))
			s.observe(observerUnloaded(e))
			s.unloadLater(e)
		}
	}
	for _, e := range next.entries {
		if old.contains(e) {
			continue
		}
		s.report(next, e)
	}
	s.channels.reconcile(ctx, next)
	return scanErr
}

// memoryLedger makes a memory plugin's ledger, with the entries its
// journal holds when the sandbox has a memory directory. A journal that
// cannot be read fails the plugin's load, naming the file, rather than
// start it empty and let a restart lose what it held.
func (s *Server) memoryLedger(plugin string) (*ledger, error) {
	if s.cfg.MemoryDir == "" {
		return newLedger(nil), nil
	}
	j, err := openJournal(s.cfg.MemoryDir, plugin, s.logger.With(zap.String("plugin", plugin)))
	if err != nil {
		return newLedger(nil), err
	}
	l := newLedger(j)
	torn, err := j.load(l)
	if err != nil {
		return newLedger(nil), err
	}
	if torn > 0 {
		s.logger.Warn("memory journal ended in a record cut short; it is dropped", zap.String("plugin", plugin), zap.Int("bytes", torn))
	}
	// The instance starts empty: the first call gives it the entries.
	l.partial = len(l.entries) > 0
	return l, nil
}

// handOverMemories gives each memory plugin loaded anew by this scan the
// entries its earlier load held (handOver); release lets calls reach
// them once next is in place.
func (s *Server) handOverMemories(ctx context.Context, old, next *catalog) (release func()) {
	var releases []func()
	for name, to := range next.memories {
		from := old.memories[name]
		if from == nil || from == to {
			continue
		}
		r, err := handOver(ctx, from.ledger, to.ledger)
		if err != nil {
			s.logger.Warn("memory entries not handed to the plugin's new load", zap.String("plugin", name), zap.Error(err))
			continue
		}
		s.logger.Info("memory entries handed to the plugin's new load", zap.String("plugin", name), zap.Int("entries", len(to.ledger.entries)))
		releases = append(releases, r)
	}
	return func() {
		for _, r := range releases {
			r()
		}
	}
}

func (c *catalog) contains(e *entry) bool {
	for _, x := range c.entries {
		if x == e {
			return true
		}
	}
	return false
}

// report logs what became of a newly loaded entry.
func (s *Server) report(c *catalog, e *entry) {
	log := s.logger.With(zap.String("dir", e.dir))
	switch {
	case e.err != nil:
		log.Warn("plugin skipped", zap.Error(e.err))
	case e.policy != nil:
		log.Warn("plugin refused by the signature policy", zap.String("plugin", e.name()), zap.Error(e.policy))
	case c.refusals[e] != "":
		// resolve logged the conflict, naming every party.
	default:
		m := e.bundle.Manifest
		if e.verdict.Warning != "" {
			log.Warn("plugin signature not verified; loading it (signature_mode permissive)",
				zap.String("plugin", m.Name), zap.String("signature", string(e.verdict.Status)), zap.String("why", e.verdict.Warning))
		}
		if inert := m.Inert(); len(inert) > 0 {
			log.Info("plugin declares permissions that grant nothing", zap.String("plugin", m.Name), zap.Any("permissions", inert))
		}
		log.Info("plugin loaded", zap.String("plugin", m.Name), zap.String("version", m.Version),
			zap.String("signature", string(e.verdict.Status)))
		s.observe(observerLoaded(e))
	}
}

// scanEntries lists the plugin folders and returns an entry for each:
// the previous one when nothing changed, else a freshly loaded one.
func (s *Server) scanEntries(ctx context.Context, old *catalog, live Live) ([]*entry, error) {
	dir := s.cfg.PluginsDir
	if dir == "" {
		return nil, nil
	}
	list, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		// Keep serving what was loaded rather than unloading everything
		// over a transient error.
		return old.entries, fmt.Errorf("pluginsandbox: read plugins dir: %w", err)
	}
	if err := trust.CheckPluginsDir(dir); err != nil {
		// Nothing loads from a folder another user could fill, and what
		// was loaded from it goes.
		return nil, fmt.Errorf("pluginsandbox: plugins dir refused, no plugin loaded: %w", err)
	}
	prev := map[string]*entry{}
	for _, e := range old.entries {
		prev[e.dir] = e
	}
	samePolicy := equalPolicy(old.live.Policy, live.Policy)
	var out []*entry
	for _, d := range list {
		// Hidden folders are install staging and removal trash.
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, d.Name())
		var cached parsedManifest
		e, ok := prev[d.Name()]
		if ok {
			cached = e.parsed
		}
		// An upgrade renames a new folder into place (and deletes the
		// old one) at any instant, and a load reads the folder by its
		// path many times: a swap meanwhile mixed the old manifest with
		// the new files, or failed the load on a file deleted under it,
		// leaving the plugin so until the next scan. The folder seen
		// before the fingerprint and after the load is compared, and a
		// load that spans a swap is done again, a bounded number of
		// times (installs are serialised, so one more is enough).
		for attempt := 1; ; attempt++ {
			before := folderID(path)
			fp, parsed := fingerprint(path, cached)
			// A folder refused as untrusted is loaded again once its files
			// are safe: a chmod of a file inside changes no fingerprint.
			if ok && e.fp == fp && samePolicy && !(errors.Is(e.err, trust.ErrUntrusted) && trust.CheckPluginFolder(path) == nil) {
				out = append(out, e)
				break
			}
			ne := s.load(ctx, d.Name(), path, fp, parsed, live.Policy)
			ne.parsed = parsed
			if attempt == maxLoadAttempts || folderID(path) == before {
				out = append(out, ne)
				break
			}
			ne.closeWorlds(ctx)
			s.logger.Info("plugin folder replaced while it was read; reading it again", zap.String("dir", d.Name()))
		}
	}
	return s.keepMovedAside(old, list, out), nil
}

// keepMovedAside returns out with the entries of old whose folder an
// upgrade moved aside (install.ReplacedPrefix) and has not yet replaced:
// where the file system cannot exchange two folders in one step, the
// installed one is renamed aside, then the new one into place, and a
// scan between the two unloaded the plugin, its tools and skills missing
// until the next scan, a whole scan interval. The version loaded is
// served until the new one is in place, and the scan is done again soon
// (Rescan). A folder left aside by an install that was killed is put
// back by the next install; its version is served meanwhile.
func (s *Server) keepMovedAside(old *catalog, list []os.DirEntry, out []*entry) []*entry {
	found := map[string]bool{}
	for _, e := range out {
		found[e.dir] = true
	}
	var aside map[string]bool // plugin names in folders moved aside
	for _, e := range old.entries {
		if found[e.dir] || e.bundle == nil {
			continue
		}
		if aside == nil {
			aside = map[string]bool{}
			for _, d := range list {
				if d.IsDir() && strings.HasPrefix(d.Name(), install.ReplacedPrefix) {
					if m, err := manifest.Load(filepath.Join(s.cfg.PluginsDir, d.Name())); err == nil {
						aside[m.Name] = true
					}
				}
			}
		}
		if aside[e.dir] {
			s.logger.Info("plugin folder moved aside by an upgrade; serving the version loaded until the new one is in place",
				zap.String("dir", e.dir), zap.String("plugin", e.name()))
			out = append(out, e)
			s.movedAside = true
		}
	}
	return out
}

// A scan that found a plugin's folder moved aside by an upgrade is done
// again after asideRescan, twice that, ..., maxAsideScans times.
const (
	asideRescan   = 200 * time.Millisecond
	maxAsideScans = 5
)

// maxLoadAttempts bounds the loads of one folder in one scan while it
// keeps being replaced under the scan.
const maxLoadAttempts = 3

// folderID identifies the folder at path: a rename-swap puts another
// folder (another inode) there; a file added or removed in it changes
// its modification time.
func folderID(path string) string {
	fi, err := os.Lstat(path)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%d:%s", fi.ModTime().UnixNano(), inode(fi))
}

// parsedManifest is a manifest's bytes' digest and what they parsed to,
// or why they could not be read (read false) or parsed (m nil).
type parsedManifest struct {
	read bool
	sum  [sha256.Size]byte
	m    *manifest.Manifest
	err  error
	// skillsOver says the fingerprint found more than
	// MaxSkillTreeFiles entries under skills/ (this scan's finding, not
	// the manifest's, so never taken from a cached parse).
	skillsOver bool
}

// parseManifest is manifest.Parse; tests count its calls.
var parseManifest = manifest.Parse

// lstat is os.Lstat; tests count the fingerprint's calls.
var lstat = os.Lstat

// loadHook, when set, runs in load between the manifest's read and the
// reads of the files it names: tests swap the folder there.
var loadHook func(path string)

// fingerprint summarises what a load reads from a plugin folder: the
// folder itself (a reinstall renames a new one into place), the
// manifest's bytes, the module's and every skill file's identity. It runs
// on every scan, so it parses the manifest only when its bytes differ
// from cached (the previous scan's): a manifest can cost far more to
// parse than to read and hash.
func fingerprint(dir string, cached parsedManifest) (string, parsedManifest) {
	h := sha256.New()
	stat := func(p string) os.FileInfo {
		fi, err := lstat(p)
		if err != nil {
			fmt.Fprintf(h, "%s:missing\n", p)
			return nil
		}
		fmt.Fprintf(h, "%s:%d:%d:%s:%s\n", p, fi.Size(), fi.ModTime().UnixNano(), fi.Mode(), inode(fi))
		return fi
	}
	stat(dir)
	var parsed parsedManifest
	data, err := manifest.ReadFile(filepath.Join(dir, manifest.FileName))
	if err != nil {
		fmt.Fprintf(h, "manifest:%v\n", err)
		parsed.err = err
	} else {
		parsed = parsedManifest{read: true, sum: sha256.Sum256(data)}
		h.Write(parsed.sum[:]) // the bytes, hashed once
		if cached.read && cached.sum == parsed.sum {
			parsed.m, parsed.err = cached.m, cached.err
		} else {
			parsed.m, parsed.err = parseManifest(data)
		}
	}
	if m := parsed.m; m != nil {
		if m.WasmPath != "" {
			stat(filepath.Join(dir, filepath.FromSlash(m.WasmPath)))
		}
		if m.Has(manifest.CapSkill) {
			if !walkSkillTree(filepath.Join(dir, manifest.SkillsDir), stat) {
				fmt.Fprintf(h, "skills:over\n")
				parsed.skillsOver = true
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), parsed
}

// walkSkillTree calls stat on root and everything under it, in lexical
// order, and reports whether it held at most MaxSkillTreeFiles entries
// (as ReadSkillFiles counts them). It runs on every scan, and a plugin
// copied in by hand has no install to bound its tree: the walk stops at
// the bound, and names are read in batches, so a folder of a million
// files costs no more than the bound. A folder is closed before its
// subfolders are read, so depth holds no file descriptors.
func walkSkillTree(root string, stat func(p string) os.FileInfo) bool {
	n := 1
	var walk func(dir string) bool
	walk = func(dir string) bool {
		// Not followed if a link, nor waited on if a FIFO, swapped in
		// since stat said it was a folder.
		f, err := os.OpenFile(dir, os.O_RDONLY|openDirFlags, 0)
		if err != nil {
			return true // the fingerprint has its stat; the load says why
		}
		var names []string
		for {
			batch, err := f.Readdirnames(256)
			names = append(names, batch...)
			if n += len(batch); n > manifest.MaxSkillTreeFiles {
				f.Close()
				return false
			}
			if err != nil {
				break
			}
		}
		f.Close()
		sort.Strings(names)
		for _, name := range names {
			p := filepath.Join(dir, name)
			if fi := stat(p); fi != nil && fi.IsDir() && !walk(p) {
				return false
			}
		}
		return true
	}
	if fi := stat(root); fi == nil || !fi.IsDir() {
		return true
	}
	return walk(root)
}

// load reads one plugin folder and loads its worlds.
func (s *Server) load(ctx context.Context, dir, path, fp string, parsed parsedManifest, policy manifest.Policy) *entry {
	e := &entry{dir: dir, path: path, fp: fp}
	if err := trust.CheckPluginFolder(path); err != nil {
		e.err = err
		return e
	}
	// What fingerprint read and parsed is what loads: the manifest is
	// parsed once, and no bytes but those fingerprinted are loaded.
	if parsed.m == nil {
		e.err = parsed.err
		return e
	}
	if parsed.skillsOver {
		// Refused before anything under skills/ is read: the load would
		// read the whole tree to find what the fingerprint found.
		e.err = fmt.Errorf("%w: %s: more than %d files and folders (the bound of an install, which a plugin copied in by hand is held to too)",
			manifest.ErrLayout, manifest.SkillsDir, manifest.MaxSkillTreeFiles)
		return e
	}
	if loadHook != nil {
		loadHook(path)
	}
	b, err := manifest.BundleOf(path, parsed.m)
	if err != nil {
		e.err = err
		return e
	}
	e.bundle = b
	m := b.Manifest
	// The module and the skill files are read before the policy is
	// applied: a signature covers their bytes (wasm_sha256,
	// skills_sha256), and the bytes checked are the ones compiled, and
	// the only skill files served (ReadSkill checks each against them).
	wasm, files, err := b.Contents()
	if err != nil {
		e.err = err
		return e
	}
	for i := range b.Skills {
		b.Skills[i].Files = files
	}
	e.verdict, e.policy = policy.Check(m, wasm, files.Digest())
	if errors.Is(e.policy, manifest.ErrDigest) {
		// A package its own digests disown is broken, not a matter of
		// policy: it fails, and says so, in every signature_mode.
		e.err, e.policy = e.policy, nil
		return e
	}
	if e.policy != nil || m.SkillOnly() {
		return e
	}
	grants := s.cfg.Grant(m)
	spec := wasmhost.PluginSpec{Name: m.Name, Version: m.Version, Wasm: wasm, Grants: grants, Schema: m.Schema(), Config: s.cfg.ConfigSource}
	if m.Has(manifest.CapTool) {
		if e.tool, err = s.cfg.Host.LoadTool(ctx, spec); err != nil {
			e.err = fmt.Errorf("tool world: %w", err)
		}
	}
	if e.err == nil && m.Has(manifest.CapMemory) {
		// The memory world imports only logging, whatever is granted.
		mem := spec
		mem.Grants, mem.Schema, mem.Config = wasmhost.Grants{}, nil, nil
		if e.memory, err = s.cfg.Host.LoadMemory(ctx, mem); err != nil {
			e.err = fmt.Errorf("memory world: %w", err)
		}
		e.ledger, err = s.memoryLedger(m.Name)
		if err != nil && e.err == nil {
			e.err = err
		}
	}
	if e.err == nil && m.Has(manifest.CapObserver) {
		obs := spec
		obs.Grants, obs.Schema, obs.Config = wasmhost.Grants{}, nil, nil
		o, err := s.cfg.Host.LoadObserver(ctx, obs)
		if err != nil {
			e.err = fmt.Errorf("observer world: %w", err)
		} else {
			e.observer = s.startObserver(m.Name, o)
		}
	}
	if e.err == nil && m.Has(manifest.CapChannel) {
		e.wasm = wasm // each binding loads its own instance
	}
	if e.err != nil {
		// The entry is still reported, with its error, and nothing loaded.
		e.closeWorlds(ctx)
		e.tool, e.memory, e.observer, e.wasm = nil, nil, nil, nil
	}
	return e
}

// resolve fills a catalog's tables from its entries, refusing conflicts:
// two folders holding plugins of one name, and two plugins offering one
// tool name, are all refused (never first come), with a log line naming
// every party.
func (s *Server) resolve(c *catalog) {
	byName := map[string][]*entry{}
	for _, e := range c.entries {
		if e.usable() {
			byName[e.name()] = append(byName[e.name()], e)
		}
	}
	for name, es := range byName {
		if len(es) < 2 {
			continue
		}
		dirs := dirsOf(es)
		s.logger.Error("plugin name offered by several folders; all refused", zap.String("plugin", name), zap.Strings("dirs", dirs))
		for _, e := range es {
			c.refusals[e] = fmt.Sprintf("plugin %s is also in %s", name, strings.Join(others(dirs, e.dir), ", "))
		}
	}
	byTool := map[string][]*entry{}
	for _, e := range c.entries {
		if e.usable() && c.refusals[e] == "" && e.tool != nil {
			byTool[e.tool.Name()] = append(byTool[e.tool.Name()], e)
		}
	}
	c.tools = map[string]*entry{}
	for tool, es := range byTool {
		if len(es) == 1 {
			c.tools[tool] = es[0]
			continue
		}
		names := make([]string, len(es))
		for i, e := range es {
			names[i] = e.name()
		}
		sort.Strings(names)
		s.logger.Error("tool name offered by several plugins; all refused", zap.String("tool", tool), zap.Strings("plugins", names))
		for _, e := range es {
			c.refusals[e] = fmt.Sprintf("tool %s is also offered by %s", tool, strings.Join(others(names, e.name()), ", "))
		}
	}
	c.memories, c.channels, c.skills = map[string]*entry{}, map[string]*entry{}, map[string]manifest.Skill{}
	for _, e := range c.entries {
		if !c.active(e) {
			continue
		}
		if e.memory != nil {
			c.memories[e.name()] = e
		}
		if e.wasm != nil {
			c.channels[e.name()] = e
		}
		for _, sk := range e.bundle.Skills {
			c.skills[sk.ID] = sk
			c.skillIDs = append(c.skillIDs, sk.ID)
		}
	}
	sort.Strings(c.skillIDs)
}

func dirsOf(es []*entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.dir
	}
	sort.Strings(out)
	return out
}

// others is list without one occurrence of self.
func others(list []string, self string) []string {
	var out []string
	skipped := false
	for _, x := range list {
		if x == self && !skipped {
			skipped = true
			continue
		}
		out = append(out, x)
	}
	return out
}

// unloadLater unloads e off the scan path, once its calls end.
func (s *Server) unloadLater(e *entry) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		e.unload(context.Background())
	}()
}

// Run rescans the plugins directory every interval and whenever Kick is
// called, until ctx ends. Each replica runs its own: installs, removals
// and config changes reach every replica without a signal.
func (s *Server) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		// The same failure scan after scan (a plugins folder refused) is
		// said once, and again when it changes or clears.
		err := s.Rescan(ctx)
		if msg := errText(err); msg != lastErr && ctx.Err() == nil {
			if err != nil {
				s.logger.Warn("plugin rescan", zap.Error(err))
			} else {
				s.logger.Info("plugin rescan succeeds again")
			}
			lastErr = msg
		}
	}
}

// Kick asks Run for a rescan soon (a config change); it never blocks.
func (s *Server) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
