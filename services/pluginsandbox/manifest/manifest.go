// Package manifest parses and validates plugin manifests (manifest.toml) and
// their config schemas, and materialises an operator's string values into
// the typed public config and the secrets of seed 003.
package manifest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
)

// Sentinel errors.
var (
	// ErrInvalid reports a manifest that breaks a validation rule.
	ErrInvalid = errors.New("manifest: invalid")
	// ErrConfig reports operator values that do not fit the config schema.
	ErrConfig = errors.New("manifest: config rejected")
)

// FileName is the manifest's file name inside a plugin directory.
const FileName = "manifest.toml"

// Capability selects a world (tool, channel, memory), an observer backend or
// a markdown skill bundle.
type Capability string

// Capabilities.
const (
	CapTool     Capability = "tool"
	CapChannel  Capability = "channel"
	CapMemory   Capability = "memory"
	CapObserver Capability = "observer"
	CapSkill    Capability = "skill"
)

// Permission is a host surface a plugin asks for.
type Permission string

// Permissions. Only config_read and http_client have an effect today; the
// others are accepted and grant nothing.
const (
	PermHTTPClient  Permission = "http_client"
	PermConfigRead  Permission = "config_read"
	PermFileRead    Permission = "file_read"
	PermFileWrite   Permission = "file_write"
	PermMemoryRead  Permission = "memory_read"
	PermMemoryWrite Permission = "memory_write"
)

var (
	knownCaps  = map[Capability]bool{CapTool: true, CapChannel: true, CapMemory: true, CapObserver: true, CapSkill: true}
	knownPerms = map[Permission]bool{PermHTTPClient: true, PermConfigRead: true, PermFileRead: true, PermFileWrite: true, PermMemoryRead: true, PermMemoryWrite: true}
	nameRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	versionRE  = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$`)
)

// Manifest is the content of manifest.toml.
type Manifest struct {
	Name         string         `toml:"name"`
	Version      string         `toml:"version"`
	Description  string         `toml:"description"`
	Author       string         `toml:"author"`
	WasmPath     string         `toml:"wasm_path"`
	Capabilities []Capability   `toml:"capabilities"`
	Permissions  []Permission   `toml:"permissions"`
	ConfigSchema map[string]any `toml:"config_schema"`
	Signature    string         `toml:"signature"`
	PublisherKey string         `toml:"publisher_key"`

	schema *ConfigSchema
}

// Parse decodes and validates a manifest. Unknown keys are refused.
func Parse(data []byte) (*Manifest, error) {
	var m Manifest
	md, err := toml.Decode(string(data), &m)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if undec := md.Undecoded(); len(undec) > 0 {
		// Keys below config_schema are schema content, not manifest fields.
		for _, k := range undec {
			if len(k) > 0 && k[0] != "config_schema" {
				return nil, fmt.Errorf("%w: unknown key %q", ErrInvalid, k.String())
			}
		}
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Load reads dir/manifest.toml.
func Load(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		return nil, fmt.Errorf("manifest: read: %w", err)
	}
	return Parse(data)
}

// Has reports whether the manifest declares the capability.
func (m *Manifest) Has(c Capability) bool {
	for _, x := range m.Capabilities {
		if x == c {
			return true
		}
	}
	return false
}

// Requests reports whether the manifest declares the permission.
func (m *Manifest) Requests(p Permission) bool {
	for _, x := range m.Permissions {
		if x == p {
			return true
		}
	}
	return false
}

// Schema returns the compiled config schema, or nil when none is declared.
func (m *Manifest) Schema() *ConfigSchema { return m.schema }

func (m *Manifest) validate() error {
	if !nameRE.MatchString(m.Name) {
		return fmt.Errorf("%w: name %q must match %s", ErrInvalid, m.Name, nameRE)
	}
	if !versionRE.MatchString(m.Version) {
		return fmt.Errorf("%w: version %q is not semver", ErrInvalid, m.Version)
	}
	if len(m.Capabilities) == 0 {
		return fmt.Errorf("%w: capabilities must not be empty", ErrInvalid)
	}
	seen := map[Capability]bool{}
	for _, c := range m.Capabilities {
		if !knownCaps[c] {
			return fmt.Errorf("%w: unknown capability %q", ErrInvalid, c)
		}
		if seen[c] {
			return fmt.Errorf("%w: capability %q listed twice", ErrInvalid, c)
		}
		seen[c] = true
	}
	skillOnly := len(m.Capabilities) == 1 && m.Capabilities[0] == CapSkill
	switch {
	case m.WasmPath == "" && !skillOnly:
		return fmt.Errorf("%w: wasm_path is required", ErrInvalid)
	case m.WasmPath != "" && (filepath.IsAbs(m.WasmPath) || strings.Contains(filepath.ToSlash(m.WasmPath), "..")):
		return fmt.Errorf("%w: wasm_path %q must stay inside the plugin directory", ErrInvalid, m.WasmPath)
	}
	for _, p := range m.Permissions {
		if !knownPerms[p] {
			return fmt.Errorf("%w: unknown permission %q", ErrInvalid, p)
		}
	}
	hasSchema := m.ConfigSchema != nil
	if m.Requests(PermConfigRead) != hasSchema {
		return fmt.Errorf("%w: config_read and config_schema must be declared together", ErrInvalid)
	}
	if hasSchema {
		if m.Has(CapMemory) && !m.Has(CapTool) && !m.Has(CapChannel) {
			return fmt.Errorf("%w: memory plugins have no config import; do not request config_read", ErrInvalid)
		}
		s, err := CompileSchema(m.ConfigSchema)
		if err != nil {
			return err
		}
		m.schema = s
	}
	return nil
}
