package manifest

import (
	"fmt"
	"os"
	"path/filepath"
)

// MaxModuleBytes caps a plugin's module file.
const MaxModuleBytes = 128 << 20

// Bundle is a plugin directory whose manifest parsed and whose layout
// matches it.
type Bundle struct {
	Dir      string
	Manifest *Manifest
	// Skills are the bundle's skills when it has the skill capability.
	Skills []Skill
}

// LoadBundle reads and checks the plugin directory dir: its manifest, its
// module (a regular file, no symbolic link) unless skill-only, and its
// skills/ bundle when it declares the skill capability. It does not check
// the signature (Policy.Check does).
func LoadBundle(dir string) (*Bundle, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	b := &Bundle{Dir: dir, Manifest: m}
	if m.WasmPath != "" {
		if _, err := b.moduleInfo(); err != nil {
			return nil, err
		}
	}
	if m.Has(CapSkill) {
		if b.Skills, err = LoadSkills(dir, m.Name); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// ModulePath is the module's file, or "" for a skill-only plugin.
func (b *Bundle) ModulePath() string {
	if b.Manifest.WasmPath == "" {
		return ""
	}
	return filepath.Join(b.Dir, filepath.FromSlash(b.Manifest.WasmPath))
}

func (b *Bundle) moduleInfo() (os.FileInfo, error) {
	fi, err := os.Lstat(b.ModulePath())
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: wasm_path %q: %w", ErrLayout, b.Manifest.WasmPath, err)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: wasm_path %q is not a regular file", ErrLayout, b.Manifest.WasmPath)
	case fi.Size() > MaxModuleBytes:
		return nil, fmt.Errorf("%w: wasm_path %q is %d bytes; the limit is %d", ErrLayout, b.Manifest.WasmPath, fi.Size(), MaxModuleBytes)
	}
	return fi, nil
}

// ReadModule reads the module.
func (b *Bundle) ReadModule() ([]byte, error) {
	if _, err := b.moduleInfo(); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(b.ModulePath())
	if err != nil {
		return nil, fmt.Errorf("%w: wasm_path: %w", ErrLayout, err)
	}
	return data, nil
}
