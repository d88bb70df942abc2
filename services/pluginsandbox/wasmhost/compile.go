package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/tetratelabs/wazero"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin"
)

// ABIVersion is the plugin ABI version this host speaks (plugins/ABI.md).
const ABIVersion = abi.Version

// World is a plugin world of seed 003.
type World = abi.World

// Worlds.
const (
	WorldTool     = abi.WorldTool
	WorldChannel  = abi.WorldChannel
	WorldMemory   = abi.WorldMemory
	WorldObserver = abi.WorldObserver
)

// worldExports are the exports each world requires, besides the core ones.
var worldExports = abi.WorldExports

var coreExports = []string{abi.ExportABIVersion, abi.ExportAlloc, abi.ExportDealloc}

var knownImports = func() map[string]bool {
	m := make(map[string]bool, len(abi.Imports))
	for _, name := range abi.Imports {
		m[name] = true
	}
	return m
}()

// Grants are the permissions the host effectively grants an admitted plugin:
// what the manifest requests and the operator allows.
type Grants struct {
	ConfigRead bool
	HTTPClient bool
}

// PluginSpec describes one plugin instance to load.
type PluginSpec struct {
	// Name and Version identify the package (from the manifest).
	Name, Version string
	// World selects the adapter.
	World World
	// Wasm is the module binary.
	Wasm []byte
	// Grants are the effective grants.
	Grants Grants
	// Schema is the manifest's compiled config schema, or nil.
	Schema *manifest.ConfigSchema
	// Binding names the logical binding (for example a channel alias);
	// empty means "default".
	Binding string
	// InstanceKey keys the operator's values; empty derives it with
	// InstanceKey(Name, World, Binding).
	InstanceKey string
	// Config resolves operator values; required when Grants.ConfigRead.
	Config ConfigSource
}

// InstanceKey is abi.InstanceKey, the key of plugins.entries.<key>.
func InstanceKey(pkg string, world World, binding string) string {
	return abi.InstanceKey(pkg, world, binding)
}

// httpAllowed: the grant, and a world whose adapter opts in (tool and
// channel do; memory deliberately does not).
func (s *PluginSpec) httpAllowed() bool {
	return s.Grants.HTTPClient && abi.WorldHasImport(s.World, abi.ImportHTTPRequest)
}

// compiled is a module prepared, compiled and checked against the ABI.
type compiled struct {
	host   *Host
	spec   *PluginSpec
	mod    wazero.CompiledModule
	report wasmbin.Report
	// callExport, when set, is the export every call of a fresh instance
	// runs (a tool's tool_execute): newInstance looks it up when it
	// instantiates, off the call's path (wazero builds a call engine with
	// its own stack for each lookup).
	callExport string
	// minMemory is the module's memory's minimum in bytes: what an
	// instance commits when it is made.
	minMemory uint64
}

// compile rewrites the module (table check, fuel, data merge), compiles it
// once (through the compilation cache) and checks its exports and imports.
func (h *Host) compile(ctx context.Context, spec PluginSpec) (*compiled, error) {
	if h.closed.Load() {
		return nil, ErrClosed
	}
	if _, ok := worldExports[spec.World]; !ok {
		return nil, fmt.Errorf("%w: unknown world %q", ErrInvalidModule, spec.World)
	}
	if spec.Grants.ConfigRead && spec.Config == nil {
		return nil, fmt.Errorf("%w: config_read granted without a config source", ErrConfig)
	}
	if spec.InstanceKey == "" {
		spec.InstanceKey = InstanceKey(spec.Name, spec.World, spec.Binding)
	}
	prepared, rep, err := wasmbin.Prepare(spec.Wasm, wasmbin.Options{
		MaxTableElements: h.cfg.Limits.MaxTableElements,
		Fuel:             !h.cfg.DisableFuel,
		MergeData:        true,
	})
	switch {
	case errors.Is(err, wasmbin.ErrTableLimit):
		return nil, fmt.Errorf("%w: %w", ErrTableLimit, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrInvalidModule, err)
	}
	compiling := fmt.Sprintf("compiling plugin %s (%s world)", spec.Name, spec.World)
	unlock, err := h.lockCompile(ctx, func() {
		h.progress(fmt.Sprintf("waiting for another replica's compile (plugin %s, %s world)", spec.Name, spec.World))
	})
	if err != nil {
		return nil, err
	}
	defer unlock()
	h.progress(compiling)
	stopTicks := h.compileTicks(compiling)
	h.remakeCacheDir()
	began, entries := time.Now(), cacheEntries(h.cfg.CacheDir)
	mod, err := h.rt.CompileModule(ctx, prepared)
	if err != nil && cacheFailed(err) {
		// The cache only saves a later compile: an entry that could not
		// be written (a full disk, the folder removed) refused a good
		// module as invalid, and discovery kept the refusal while the
		// plugin's files stayed the same. wazero keeps the module it
		// compiled in memory before it writes the entry, and answers the
		// same module from there, so a second compile loads it. (That
		// first compile's hold on the memory entry is never given back:
		// one compiled module per module whose entry failed.)
		h.logger.Warn("compilation cache entry not written; the module is compiled but not cached",
			zap.String("plugin", spec.Name), zap.Error(err))
		mod, err = h.rt.CompileModule(ctx, prepared)
	}
	stopTicks()
	h.trimCache() // the compile may have added an entry
	if err != nil && cacheFailed(err) {
		return nil, fmt.Errorf("wasmhost: compilation cache: %w", err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidModule, err)
	}
	if h.cfg.CacheDir != "" {
		// Said, so that a slow start shows which replica did the work.
		msg := "plugin loaded from the compilation cache"
		if cacheEntries(h.cfg.CacheDir) > entries {
			msg = "plugin compiled"
		}
		h.logger.Info(msg, zap.String("plugin", spec.Name), zap.String("world", string(spec.World)),
			zap.Duration("took", time.Since(began)))
	}
	c := &compiled{host: h, spec: &spec, mod: mod, report: rep, minMemory: minMemory(mod)}
	if err := c.checkABI(); err != nil {
		_ = mod.Close(ctx)
		return nil, err
	}
	return c, nil
}

// progress tells Config.Progress what a load does now.
func (h *Host) progress(what string) {
	if h.cfg.Progress != nil {
		h.cfg.Progress(what)
	}
}

// remakeCacheDir makes the compilation cache's folders again if they were
// removed (by hand, or a cleaner of old files): wazero makes them only
// when the cache is made, so until the sandbox restarted every module
// compiled went uncached, and each kept a compiled copy in memory for
// good (see the retry in compile). Making a cache for the same folder has
// wazero make them as it names them, and costs two stats when they are
// there; compiles are rare (a load), and the one that follows writes its
// entry. A failure is left to the compile, which loads the module
// uncached.
func (h *Host) remakeCacheDir() {
	if h.cfg.CacheDir == "" {
		return
	}
	if c, err := wazero.NewCompilationCacheWithDir(h.cfg.CacheDir); err == nil {
		_ = c.Close(context.Background()) // holds no engine: nothing compiled through it
	}
}

// cacheFailed reports whether a compile failed on the compilation cache's
// files rather than on the module: wazero returns the file system's error
// as it is (the module's own are never a path's).
func cacheFailed(err error) bool {
	var pe *fs.PathError
	var le *os.LinkError
	return errors.As(err, &pe) || errors.As(err, &le)
}

func (c *compiled) checkABI() error {
	exports := c.mod.ExportedFunctions()
	for _, name := range append(append([]string(nil), coreExports...), worldExports[c.spec.World]...) {
		if _, ok := exports[name]; !ok {
			return fmt.Errorf("%w: missing export %q for the %s world", ErrABI, name, c.spec.World)
		}
	}
	if len(c.mod.ExportedMemories()) == 0 {
		return fmt.Errorf("%w: module exports no memory", ErrABI)
	}
	// A start section naming a function that takes or returns values is
	// invalid as written; once wasmbin has made it an export nothing else
	// would refuse it.
	if f, ok := exports[wasmbin.StartExport]; ok && (len(f.ParamTypes()) > 0 || len(f.ResultTypes()) > 0) {
		return fmt.Errorf("%w: the start function takes or returns values", ErrInvalidModule)
	}
	for _, imp := range c.mod.ImportedFunctions() {
		mod, name, _ := imp.Import()
		switch {
		case mod == "wasi_snapshot_preview1":
		case mod == HostModule && knownImports[name]:
		default:
			return fmt.Errorf("%w: unknown import %s.%s", ErrABI, mod, name)
		}
	}
	return nil
}

// minMemory is what the module's memories (one in wasm 1.0, imported or
// its own) take when an instance is made, in bytes.
func minMemory(mod wazero.CompiledModule) uint64 {
	var pages uint64
	for _, m := range mod.ExportedMemories() {
		pages += uint64(m.Min())
	}
	for _, m := range mod.ImportedMemories() {
		pages += uint64(m.Min())
	}
	return pages << 16
}
