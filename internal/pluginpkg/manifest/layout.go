package manifest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	return BundleOf(dir, m)
}

// BundleOf is LoadBundle for a manifest the caller has read and parsed
// from dir already: a manifest can cost far more to parse than to read.
func BundleOf(dir string, m *Manifest) (*Bundle, error) {
	var err error
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

// moduleInfo checks every component of wasm_path with Lstat: the folders
// on the way must be folders, not links to folders (which could lead out
// of the plugin), and the module a regular file within MaxModuleBytes.
func (b *Bundle) moduleInfo() (os.FileInfo, error) {
	wp := b.Manifest.WasmPath
	parts := strings.Split(wp, "/")
	p := b.Dir
	for i, part := range parts {
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		last := i == len(parts)-1
		switch {
		case err != nil:
			return nil, fmt.Errorf("%w: wasm_path %q: %w", ErrLayout, wp, err)
		case !last && !fi.IsDir():
			return nil, fmt.Errorf("%w: wasm_path %q: %s is not a folder (a link to one is refused)", ErrLayout, wp, strings.Join(parts[:i+1], "/"))
		case !last:
		case !fi.Mode().IsRegular():
			return nil, fmt.Errorf("%w: wasm_path %q is not a regular file", ErrLayout, wp)
		case fi.Size() > MaxModuleBytes:
			return nil, fmt.Errorf("%w: wasm_path %q is %d bytes; the limit is %d", ErrLayout, wp, fi.Size(), MaxModuleBytes)
		default:
			return fi, nil
		}
	}
	return nil, fmt.Errorf("%w: wasm_path %q is empty", ErrLayout, wp)
}

// ReadModule reads the module, through the plugin directory as an
// os.Root: a link swapped in after moduleInfo still cannot lead out of it.
func (b *Bundle) ReadModule() ([]byte, error) {
	if _, err := b.moduleInfo(); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(b.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: wasm_path: %w", ErrLayout, err)
	}
	defer root.Close()
	data, err := readRegular(filepath.FromSlash(b.Manifest.WasmPath), MaxModuleBytes, func(name string, flag int) (*os.File, error) {
		return root.OpenFile(name, flag, 0)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: wasm_path: %w", ErrLayout, err)
	}
	return data, nil
}

// Contents reads what a signature covers besides the manifest: the
// module (nil for a skill-only plugin) and, for a plugin with the skill
// capability, its skills/ files (nil otherwise), whose Digest is what
// Policy.Check, Verify and Sign take.
func (b *Bundle) Contents() (module []byte, skills SkillFiles, err error) {
	if !b.Manifest.SkillOnly() {
		if module, err = b.ReadModule(); err != nil {
			return nil, nil, err
		}
	}
	if b.Manifest.Has(CapSkill) {
		if skills, err = b.ReadSkillFiles(); err != nil {
			return nil, nil, err
		}
	}
	return module, skills, nil
}
