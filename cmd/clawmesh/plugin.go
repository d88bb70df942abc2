package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

const pluginUsage = `usage: clawmesh plugin <command> [flags] [args]

commands:
  list                      installed plugins; with the stack running, their state (plugins/list)
  search QUERY              search the registry index (reads the index only: installs and runs nothing)
  install SOURCE            install from ./dir, ./dir/manifest.toml, or NAME[@VERSION] from the registry
                            (SOURCE is a path only when it holds a /, starts with . or ends in
                            manifest.toml: a bare NAME is always the registry's, even when the
                            current directory holds a folder of that name)
  remove NAME               uninstall (--purge also deletes plugins.entries.<key>
                            and the plugin's memory journal, of a plugin
                            removed before too)
  info NAME                 manifest, signature and the default tool binding's instance key
  sign --key FILE PATH      sign PATH (a plugin dir or its manifest.toml) with an Ed25519 key
  keygen --out FILE         write a new Ed25519 key (hex seed, 0600) and print its public key

The registry index is --registry URL, else ZEROCLAW_PLUGIN_REGISTRY_URL,
else the default (https, http, file:// or a local path).

Installing and removing work on the data directory's plugins folder
(--config-dir, or --plugins-dir): every sandbox replica notices the change
by itself, without a restart. With the stack running, the CLI reads
plugins.plugins_dir, plugins.security and its data directory (where
--purge deletes memory journals) from it over the client socket
(as the operator, or --token) and seeds plugins.entries.<key>.config of a
tool; with the stack stopped it installs under --signature-mode and
--trusted-key (default: permissive), the sandbox checks the signature
policy again when it loads the plugin, and nothing is seeded.
`

// pluginCmd runs `clawmesh plugin`.
func pluginCmd(args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, pluginUsage)
		return usageErrorf("plugin: no command")
	}
	cmd := args[0]
	fs := flag.NewFlagSet("plugin "+cmd, flag.ContinueOnError)
	var (
		sf                     socketFlags
		registry, pluginsDir   string
		mode, keyFile, outFile string
		channel                string
		purge, all             bool
		trusted                multiFlag
	)
	// Each subcommand takes only the flags it reads: every one took all
	// of them, so `plugin list --purge` ran as if it meant something.
	for _, f := range []struct {
		cmds []string
		add  func()
	}{
		{[]string{"list", "install", "remove", "info"}, func() {
			sf.register(fs)
			fs.StringVar(&pluginsDir, "plugins-dir", "", "plugins folder (default: plugins.plugins_dir, else <data>/plugins)")
		}},
		{[]string{"install", "remove", "info"}, func() {
			fs.StringVar(&mode, "signature-mode", "", "signature policy when the stack is stopped: disabled, permissive or strict")
			fs.Var(&trusted, "trusted-key", "trusted publisher key (hex) when the stack is stopped (repeatable)")
		}},
		{[]string{"search", "install"}, func() {
			fs.StringVar(&registry, "registry", "", "registry index URL (env "+install.RegistryEnv+")")
		}},
		{[]string{"sign"}, func() {
			fs.StringVar(&keyFile, "key", "", "Ed25519 private key file (PEM PKCS#8, or hex seed)")
		}},
		{[]string{"keygen"}, func() { fs.StringVar(&outFile, "out", "", "where to write the new key") }},
		{[]string{"info"}, func() { fs.StringVar(&channel, "channel", "", "also print the instance key of this channel alias") }},
		{[]string{"remove"}, func() {
			fs.BoolVar(&purge, "purge", false, "also delete the plugin's plugins.entries config and memory journal")
		}},
		{[]string{"list"}, func() { fs.BoolVar(&all, "all", true, "include refused and failed plugins") }},
	} {
		if slices.Contains(f.cmds, cmd) {
			f.add()
		}
	}
	if isHelp(cmd) {
		fmt.Fprint(out, pluginUsage)
		return nil
	}
	if !slices.Contains([]string{"list", "search", "install", "remove", "info", "sign", "keygen"}, cmd) {
		// Before the flags: `plugin bogus -h` is refused, not helped.
		fmt.Fprint(os.Stderr, pluginUsage)
		return usageErrorf("plugin: unknown command %q", cmd)
	}
	rest, err := parseArgs(fs, args[1:])
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	p := &pluginEnv{sf: sf, pluginsDir: pluginsDir, mode: mode, trusted: trusted, out: out}
	defer p.close()
	switch cmd {
	case "list":
		return p.list(all)
	case "search":
		return p.search(ctx, registry, strings.Join(rest, " "))
	case "install":
		if len(rest) != 1 {
			return usageErrorf("plugin install: want one SOURCE")
		}
		return p.install(ctx, registry, rest[0])
	case "remove":
		if len(rest) != 1 {
			return usageErrorf("plugin remove: want one NAME")
		}
		return p.remove(rest[0], purge)
	case "info":
		if len(rest) != 1 {
			return usageErrorf("plugin info: want one NAME")
		}
		return p.info(rest[0], channel)
	case "sign":
		if len(rest) != 1 || keyFile == "" {
			return usageErrorf("plugin sign: want --key FILE and one PATH")
		}
		return signManifest(out, keyFile, rest[0])
	case "keygen":
		if outFile == "" {
			return usageErrorf("plugin keygen: want --out FILE")
		}
		return keygen(out, outFile)
	}
	fmt.Fprint(os.Stderr, pluginUsage)
	return usageErrorf("plugin: unknown command %q", cmd)
}

// pluginEnv is what the plugin commands share: the data directory, the
// running stack when there is one, the plugins folder and the policy.
type pluginEnv struct {
	sf         socketFlags
	pluginsDir string
	mode       string
	trusted    []string
	out        io.Writer

	client  *rpcclient.Client
	dialed  bool
	dialErr error
	data    string // dataDir's answer, once known
}

func (p *pluginEnv) close() {
	if p.client != nil {
		p.client.Close()
	}
}

// stack returns a client of the running stack, or nil when it is not
// running (no socket, or nobody accepting on it). Any other failure (a
// refused token, say) is the command's error: it must not be mistaken for
// a stopped stack.
func (p *pluginEnv) stack() *rpcclient.Client {
	if !p.dialed {
		p.dialed = true
		p.client, p.dialErr = p.sf.dial()
		if errors.Is(p.dialErr, syscall.ENOENT) || errors.Is(p.dialErr, syscall.ECONNREFUSED) {
			p.dialErr = nil
		}
	}
	return p.client
}

// reachable is stack's error: nil when the stack runs or is stopped.
func (p *pluginEnv) reachable() error {
	p.stack()
	return p.dialErr
}

// get reads one config property from the running stack.
func (p *pluginEnv) get(prop string, v any) error {
	res, err := p.stack().Call("config/get", map[string]any{"prop": prop})
	if err != nil {
		return err
	}
	var r struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	return json.Unmarshal(r.Value, v)
}

// dir is the plugins folder: --plugins-dir, else the running stack's
// plugins.plugins_dir, else <data>/plugins.
func (p *pluginEnv) dir() (string, error) {
	if p.pluginsDir != "" {
		return filepath.Abs(p.pluginsDir)
	}
	if p.stack() != nil {
		var dir string
		if err := p.get("plugins.plugins_dir", &dir); err == nil && dir != "" {
			return dir, nil
		}
	}
	data, err := p.dataDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(data, "plugins"), nil
}

// dataDir is the running stack's data directory (status's config_dir),
// else the CLI's own (--config-dir, the environment). A stack reached
// through --socket or ZEROCLAW_SOCKET may run on another directory than
// the CLI would resolve: its plugins and memory journals are there, and
// acting on the CLI's removed and purged what the stack never reads.
func (p *pluginEnv) dataDir() (string, error) {
	if p.data != "" {
		return p.data, nil
	}
	c := p.stack()
	if c == nil {
		dir, err := datadir.Resolve(p.sf.dir)
		p.data = dir
		return dir, err
	}
	raw, err := c.Call("status", map[string]any{})
	if err != nil {
		return "", fmt.Errorf("the running stack's data directory (status): %w", err)
	}
	var st struct {
		ConfigDir string `json:"config_dir"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.ConfigDir == "" {
		return "", fmt.Errorf("the running stack's status names no config_dir (%v)", err)
	}
	p.data = st.ConfigDir
	return p.data, nil
}

// policy is the running stack's plugins.security, else the flags'.
func (p *pluginEnv) policy() (manifest.Policy, error) {
	if p.stack() != nil && p.mode == "" && len(p.trusted) == 0 {
		var sec struct {
			Mode    string   `json:"signature_mode"`
			Trusted []string `json:"trusted_publisher_keys"`
		}
		if err := p.get("plugins.security", &sec); err != nil {
			return manifest.Policy{}, fmt.Errorf("read plugins.security: %w", err)
		}
		pol := manifest.Policy{Mode: manifest.Mode(sec.Mode), Trusted: sec.Trusted}
		return pol, pol.Validate()
	}
	pol := manifest.DefaultPolicy()
	if p.mode != "" {
		pol.Mode = manifest.Mode(p.mode)
	}
	pol.Trusted = p.trusted
	return pol, pol.Validate()
}

func (p *pluginEnv) installer() (*install.Installer, error) {
	if err := p.reachable(); err != nil {
		return nil, err
	}
	dir, err := p.dir()
	if err != nil {
		return nil, err
	}
	pol, err := p.policy()
	if err != nil {
		return nil, err
	}
	return &install.Installer{PluginsDir: dir, Policy: pol}, nil
}

// isLocal tells a path from NAME[@VERSION] by its spelling alone, as seed
// 003's forms do (./my-plugin, ./my-plugin/manifest.toml,
// /path/to/my-plugin/). Never by what the current directory holds: in a
// shared one (/tmp) another user's folder would shadow the registry entry.
func isLocal(src string) bool {
	return strings.ContainsAny(src, `/\`) || strings.HasPrefix(src, ".") || strings.HasSuffix(src, manifest.FileName)
}

func (p *pluginEnv) install(ctx context.Context, registry, src string) error {
	in, err := p.installer()
	if err != nil {
		return err
	}
	var res *install.Result
	if isLocal(src) {
		res, err = in.InstallPath(ctx, src)
	} else {
		res, err = in.InstallRegistry(ctx, install.RegistryURL(registry), src)
		if _, serr := os.Lstat(src); err != nil && serr == nil {
			err = fmt.Errorf("%w (a bare name is looked up in the registry; for the folder here, write ./%s)", err, src)
		}
	}
	if err != nil {
		return fmt.Errorf("plugin install: %w", err)
	}
	verb := "installed"
	if res.Replaced {
		verb = "replaced"
	}
	fmt.Fprintf(p.out, "%s %s %s in %s\n", verb, res.Name, res.Version, res.Dir)
	fmt.Fprintf(p.out, "signature: %s%s\n", res.Verdict.Status, warning(res.Verdict))
	if inert := res.Manifest.Inert(); len(inert) > 0 {
		fmt.Fprintf(p.out, "note: permissions %v are declared but grant nothing\n", inert)
	}
	if !res.Manifest.Has(manifest.CapTool) {
		return nil
	}
	key := abi.InstanceKey(res.Name, abi.WorldTool, "")
	prop := "plugins.entries." + key + ".config"
	fmt.Fprintf(p.out, "tool instance key: %s\n", key)
	if p.stack() == nil {
		fmt.Fprintf(p.out, "the stack is not running: %s was not seeded; start the stack and run `clawmesh config set %s={...}` (or install again)\n", prop, prop)
		return nil
	}
	var existing map[string]any
	if err := p.get(prop, &existing); err == nil && len(existing) > 0 {
		fmt.Fprintf(p.out, "%s already holds values; kept\n", prop)
		return nil
	}
	if _, err := p.stack().Call("config/set", map[string]any{"prop": prop, "value": map[string]any{}}); err != nil {
		return fmt.Errorf("plugin install: seed %s: %w", prop, err)
	}
	fmt.Fprintf(p.out, "seeded %s (secret, encrypted at rest); set values with `clawmesh config set %s=...`\n", prop, prop)
	return nil
}

func warning(v manifest.Verdict) string {
	if v.Warning == "" {
		return ""
	}
	return " (" + v.Warning + ")"
}

func (p *pluginEnv) remove(name string, purge bool) error {
	in, err := p.installer()
	if err != nil {
		return err
	}
	dir, err := in.Remove(name)
	switch {
	case purge && errors.Is(err, install.ErrNotInstalled) && manifest.NamePattern.MatchString(name):
		// What a plain remove kept (the journal, the config entry) is
		// what --purge is for, and it is still there after the plugin
		// is gone: nothing else deletes it.
		fmt.Fprintf(p.out, "%s is not installed in %s; purging what it left\n", name, in.PluginsDir)
	case err != nil:
		return fmt.Errorf("plugin remove: %w", err)
	default:
		fmt.Fprintf(p.out, "removed %s from %s\n", name, dir)
	}
	if !purge {
		return nil
	}
	if err := p.purgeMemories(name); err != nil {
		return fmt.Errorf("plugin remove --purge: %w", err)
	}
	if p.stack() == nil {
		return fmt.Errorf("plugin remove --purge: the stack is not running; its config entry was kept")
	}
	key := abi.InstanceKey(name, abi.WorldTool, "")
	if _, err := p.stack().Call("config/delete", map[string]any{"prop": "plugins.entries." + key}); err != nil {
		return fmt.Errorf("plugin remove --purge: %w", err)
	}
	fmt.Fprintf(p.out, "deleted plugins.entries.%s\n", key)
	return nil
}

// purgeMemories deletes a memory plugin's journal in the data
// directory (the running stack's, else the CLI's), and any file a
// rewrite of it cut short left: removal alone keeps it, so that the
// plugin installed again gets its memories back (a sandbox loading it
// reads the journal), and nothing else ever deleted it. It says which
// folder it looked in, found or not.
func (p *pluginEnv) purgeMemories(name string) error {
	data, err := p.dataDir()
	if err != nil {
		return err
	}
	memories := datadir.Memories(data)
	journal := datadir.MemoryJournal(memories, name)
	leftovers, _ := filepath.Glob(journal + ".*")
	found := false
	for _, f := range append([]string{journal}, leftovers...) {
		err := os.Remove(f)
		switch {
		case err == nil:
			found = true
			fmt.Fprintf(p.out, "deleted %s\n", shown(f))
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
	}
	if !found {
		fmt.Fprintf(p.out, "no memory journal of %s in %s\n", shown(name), shown(memories))
	}
	return nil
}

func (p *pluginEnv) search(ctx context.Context, registry, query string) error {
	idx, err := (&install.Client{}).FetchIndex(ctx, install.RegistryURL(registry))
	if err != nil {
		return fmt.Errorf("plugin search: %w", err)
	}
	tw := tabwriter.NewWriter(p.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tCAPABILITIES\tDESCRIPTION")
	for _, e := range idx.Search(query) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", shown(e.Name), shown(e.Version), shown(strings.Join(e.Capabilities, ",")), shown(e.Description))
	}
	return tw.Flush()
}

// list prints the running stack's view (plugins/list), or the plugins
// folder's manifests when the stack is stopped.
func (p *pluginEnv) list(all bool) error {
	if err := p.reachable(); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(p.out, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	if c := p.stack(); c != nil {
		res, err := c.Call("plugins/list", map[string]any{"all": all})
		if err != nil {
			return fmt.Errorf("plugin list: %w", err)
		}
		var r struct {
			Enabled  bool   `json:"enabled"`
			Dir      string `json:"plugins_dir"`
			Mode     string `json:"signature_mode"`
			Plugins  []map[string]any
			Channels []map[string]any
		}
		if err := json.Unmarshal(res, &r); err != nil {
			return err
		}
		fmt.Fprintf(tw, "plugins %s in %s, signature_mode %s\n", map[bool]string{true: "enabled", false: "DISABLED"}[r.Enabled], shown(r.Dir), shown(r.Mode))
		fmt.Fprintln(tw, "NAME\tVERSION\tSTATUS\tSIGNATURE\tCAPABILITIES\tTOOL\tREASON")
		for _, pl := range r.Plugins {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", shownAny(pl["name"]), shownAny(pl["version"]), shownAny(pl["status"]),
				shownAny(pl["signature_status"]), shown(joinAny(pl["capabilities"])), shownAny(pl["tool_name"]), shownAny(pl["reason"]))
		}
		for _, ch := range r.Channels {
			fmt.Fprintf(tw, "channel %s\t%s\t%s\t%s\t%s\n", shownAny(ch["alias"]), shownAny(ch["plugin"]), shownAny(ch["listen"]), shownAny(ch["state"]), shownAny(ch["reason"]))
		}
		return nil
	}
	dir, err := p.dir()
	if err != nil {
		return err
	}
	// A folder not made yet holds no plugin; one that cannot be read
	// (a file, a folder not ours to list) must not read as empty.
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("plugin list: %w", err)
	}
	fmt.Fprintf(tw, "the stack is not running; plugins installed in %s:\n", dir)
	fmt.Fprintln(tw, "NAME\tVERSION\tCAPABILITIES\tFOLDER\tPROBLEM")
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := manifest.LoadBundle(filepath.Join(dir, e.Name()))
		if err != nil {
			fmt.Fprintf(tw, "?\t?\t\t%s\t%s\n", shown(e.Name()), shownAny(err))
			continue
		}
		m := b.Manifest
		caps := make([]string, len(m.Capabilities))
		for i, c := range m.Capabilities {
			caps[i] = string(c)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", shown(m.Name), shown(m.Version), shown(strings.Join(caps, ",")), shown(e.Name()))
	}
	return nil
}

func joinAny(v any) string {
	list, _ := v.([]any)
	parts := make([]string, 0, len(list))
	for _, x := range list {
		parts = append(parts, fmt.Sprint(x))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func (p *pluginEnv) info(name, channel string) error {
	in, err := p.installer()
	if err != nil {
		return err
	}
	if !manifest.NamePattern.MatchString(name) {
		return fmt.Errorf("plugin info: %q is not a plugin name", name)
	}
	dir := filepath.Join(in.PluginsDir, name)
	b, err := manifest.LoadBundle(dir)
	if err != nil {
		return fmt.Errorf("plugin info: %w", err)
	}
	m := b.Manifest
	module, skills, err := b.Contents()
	if err != nil {
		return fmt.Errorf("plugin info: %w", err)
	}
	v, perr := in.Policy.Check(m, module, skills.Digest())
	fmt.Fprintf(p.out, "name:          %s\nversion:       %s\ndescription:   %s\nauthor:        %s\nfolder:        %s\n",
		shown(m.Name), shown(m.Version), shown(m.Description), shown(m.Author), shown(dir))
	caps := make([]string, len(m.Capabilities))
	for i, c := range m.Capabilities {
		caps[i] = string(c)
	}
	perms := make([]string, len(m.Permissions))
	for i, c := range m.Permissions {
		perms[i] = string(c)
	}
	fmt.Fprintf(p.out, "capabilities:  %s\npermissions:   %s\n", shown(strings.Join(caps, ", ")), shown(strings.Join(perms, ", ")))
	if inert := m.Inert(); len(inert) > 0 {
		fmt.Fprintf(p.out, "grant nothing: %s\n", shownAny(inert))
	}
	fmt.Fprintf(p.out, "signature:     %s under signature_mode %s%s\n", v.Status, in.Policy.Mode, warning(v))
	if perr != nil {
		fmt.Fprintf(p.out, "               refused: %s\n", shownAny(perr))
	}
	if m.Has(manifest.CapTool) {
		key := abi.InstanceKey(m.Name, abi.WorldTool, "")
		fmt.Fprintf(p.out, "tool key:      %s\n               (clawmesh config set plugins.entries.%s.config=...)\n", key, key)
	}
	if channel != "" {
		if !m.Has(manifest.CapChannel) {
			return fmt.Errorf("plugin info: %s is not a channel plugin", m.Name)
		}
		fmt.Fprintf(p.out, "channel key:   %s (alias %s)\n", abi.InstanceKey(m.Name, abi.WorldChannel, channel), channel)
	}
	for _, sk := range b.Skills {
		fmt.Fprintf(p.out, "skill:         %s  %s\n", shown(sk.ID), shown(sk.Description))
	}
	if m.Schema() != nil {
		raw, _ := json.Marshal(m.ConfigSchema)
		fmt.Fprintf(p.out, "config_schema: %s\n", raw)
	}
	return nil
}

// signManifest signs a manifest in place (written to a temporary file in
// its folder, then renamed over it).
func signManifest(out io.Writer, keyFile, target string) error {
	raw, err := os.ReadFile(keyFile)
	if err != nil {
		return fmt.Errorf("plugin sign: %w", err)
	}
	priv, err := manifest.ParsePrivateKey(raw)
	if err != nil {
		return fmt.Errorf("plugin sign: %w", err)
	}
	if fi, err := os.Stat(target); err == nil && fi.IsDir() {
		target = filepath.Join(target, manifest.FileName)
	}
	data, err := manifest.ReadFile(target)
	if err != nil {
		return fmt.Errorf("plugin sign: %w", err)
	}
	// The signature covers the module and the skill files too
	// (wasm_sha256, skills_sha256): read them from beside the manifest,
	// as discovery will.
	m, err := manifest.Parse(data)
	if err != nil {
		return fmt.Errorf("plugin sign: %w", err)
	}
	var module []byte
	var skills manifest.SkillFiles
	b, err := manifest.BundleOf(filepath.Dir(target), m)
	if err == nil {
		module, skills, err = b.Contents()
	}
	if err != nil {
		return fmt.Errorf("plugin sign: the files the signature is to cover: %w", err)
	}
	signed, err := manifest.Sign(data, module, skills.Digest(), priv)
	if err != nil {
		return fmt.Errorf("plugin sign: %w", err)
	}
	if err := atomicfile.Replace(target, signed, 0o644); err != nil {
		return fmt.Errorf("plugin sign: %w", err)
	}
	fmt.Fprintf(out, "signed %s\npublisher_key = %s\n", target, hex.EncodeToString(priv.Public().(ed25519.PublicKey)))
	return nil
}

// keygen writes a new Ed25519 key as a hex seed, readable by its owner
// only, and prints the public key to trust.
func keygen(out io.Writer, file string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("plugin keygen: %w", err)
	}
	if _, err := fmt.Fprintln(f, hex.EncodeToString(priv.Seed())); err != nil {
		f.Close()
		return fmt.Errorf("plugin keygen: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plugin keygen: %w", err)
	}
	fmt.Fprintf(out, "wrote %s\npublic key: %s\ntrust it with: clawmesh config set plugins.security.trusted_publisher_keys=%s\n", file, hex.EncodeToString(pub), hex.EncodeToString(pub))
	return nil
}
