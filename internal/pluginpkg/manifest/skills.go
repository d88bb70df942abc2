package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// Skill bundle limits.
const (
	// SkillsDir is the bundle folder inside a plugin directory.
	SkillsDir = "skills"
	// SkillFile is each skill's entry point.
	SkillFile = "SKILL.md"
	// MaxSkills bounds the skills of one plugin.
	MaxSkills = 256
	// MaxSkillBytes bounds one SKILL.md.
	MaxSkillBytes = 256 << 10
	// MaxSkillDescription bounds a skill's description, as agentskills.io
	// does (1024 characters): every skill's goes into one listing, and 256
	// skills of a bundle could have put 64 MiB in it.
	MaxSkillDescription = 1024
)

// skillName is the agentskills.io form of a skill's name, which is also
// its folder's name.
var skillName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$`)

// Skill is one skill of a bundle.
type Skill struct {
	// ID is plugin:<plugin>/<skill>, namespaced so that bundles never
	// collide with each other or with the user's own skills.
	ID          string
	Plugin      string
	Name        string
	Description string
	// Dir is the skill's folder.
	Dir string
	// Files are the bundle's files as loaded (discovery fills them): a
	// file is served only while it still has the digest checked.
	Files SkillFiles
}

// SkillID is the namespaced id of a plugin's skill.
func SkillID(plugin, skill string) string { return "plugin:" + plugin + "/" + skill }

// ParseSkillID splits plugin:<plugin>/<skill>.
func ParseSkillID(id string) (plugin, skill string, ok bool) {
	rest, ok := strings.CutPrefix(id, "plugin:")
	if !ok {
		return "", "", false
	}
	plugin, skill, ok = strings.Cut(rest, "/")
	if !ok || !NamePattern.MatchString(plugin) || !skillName.MatchString(skill) {
		return "", "", false
	}
	return plugin, skill, true
}

// LoadSkills reads the skills/ bundle of plugin directory dir: every
// skills/<name>/SKILL.md must open with YAML front matter holding a
// non-empty name (equal to its folder's) and description. Symbolic links
// are refused, so nothing outside the plugin directory can be read
// through a skill.
func LoadSkills(dir, plugin string) ([]Skill, error) {
	root := filepath.Join(dir, SkillsDir)
	fi, err := os.Lstat(root)
	if err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: a skill plugin needs a %s/ folder", ErrLayout, SkillsDir)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLayout, SkillsDir, err)
	}
	var out []Skill
	for _, e := range entries {
		rel := SkillsDir + "/" + e.Name()
		if e.Type()&os.ModeSymlink != 0 {
			return nil, fmt.Errorf("%w: %s is a symbolic link", ErrLayout, rel)
		}
		if !e.IsDir() {
			continue // a README beside the skills
		}
		if !skillName.MatchString(e.Name()) {
			return nil, fmt.Errorf("%w: %s: a skill folder is named with lower-case letters, digits and hyphens", ErrLayout, rel)
		}
		if len(out) == MaxSkills {
			return nil, fmt.Errorf("%w: more than %d skills", ErrLayout, MaxSkills)
		}
		s, err := readSkill(filepath.Join(root, e.Name()), rel)
		if err != nil {
			return nil, err
		}
		s.Plugin, s.ID = plugin, SkillID(plugin, s.Name)
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s/ holds no skill", ErrLayout, SkillsDir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func readSkill(dir, rel string) (Skill, error) {
	file := filepath.Join(dir, SkillFile)
	fi, err := os.Lstat(file)
	switch {
	case err != nil:
		return Skill{}, fmt.Errorf("%w: %s/%s is missing", ErrLayout, rel, SkillFile)
	case !fi.Mode().IsRegular():
		return Skill{}, fmt.Errorf("%w: %s/%s is not a regular file", ErrLayout, rel, SkillFile)
	case fi.Size() > MaxSkillBytes:
		return Skill{}, fmt.Errorf("%w: %s/%s is %d bytes; the limit is %d", ErrLayout, rel, SkillFile, fi.Size(), MaxSkillBytes)
	}
	data, err := readRegular(file, MaxSkillBytes, openNoFollow)
	if err != nil {
		return Skill{}, fmt.Errorf("%w: %s/%s: %w", ErrLayout, rel, SkillFile, err)
	}
	fm, err := FrontMatter(data)
	if err != nil {
		return Skill{}, fmt.Errorf("%w: %s/%s: %w", ErrLayout, rel, SkillFile, err)
	}
	switch {
	case strings.TrimSpace(fm.Name) == "":
		return Skill{}, fmt.Errorf("%w: %s/%s: front matter lacks name", ErrLayout, rel, SkillFile)
	case strings.TrimSpace(fm.Description) == "":
		return Skill{}, fmt.Errorf("%w: %s/%s: front matter lacks description", ErrLayout, rel, SkillFile)
	case len(strings.TrimSpace(fm.Description)) > MaxSkillDescription:
		return Skill{}, fmt.Errorf("%w: %s/%s: description is %d bytes; the limit is %d", ErrLayout, rel, SkillFile, len(strings.TrimSpace(fm.Description)), MaxSkillDescription)
	case fm.Name != filepath.Base(dir):
		return Skill{}, fmt.Errorf("%w: %s/%s: name %q differs from its folder's", ErrLayout, rel, SkillFile, fm.Name)
	}
	return Skill{Name: fm.Name, Description: strings.TrimSpace(fm.Description), Dir: dir}, nil
}

// SkillFrontMatter is the YAML front matter of a SKILL.md; other keys are
// allowed and ignored.
type SkillFrontMatter struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
}

// FrontMatter parses the YAML block between a first line "---" and the
// next line "---".
func FrontMatter(data []byte) (SkillFrontMatter, error) {
	var fm SkillFrontMatter
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	if strings.TrimRight(lines[0], " \t") != "---" {
		return fm, errors.New("no YAML front matter (the file must start with a --- line)")
	}
	end := -1
	for i := 1; i < len(lines); i++ {
		if strings.TrimRight(lines[i], " \t") == "---" {
			end = i
			break
		}
	}
	if end < 0 {
		return fm, errors.New("the front matter has no closing --- line")
	}
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(strings.Join(lines[1:end], "\n")), &raw); err != nil {
		return fm, fmt.Errorf("front matter: %w", err)
	}
	for key, dst := range map[string]*string{"name": &fm.Name, "description": &fm.Description} {
		v, has := raw[key]
		if !has {
			continue
		}
		s, ok := v.(string)
		if !ok {
			return fm, fmt.Errorf("front matter: %s must be a string", key)
		}
		*dst = s
	}
	return fm, nil
}

// Limits of the skills/ folder whose files a signature covers.
const (
	// MaxSkillTreeFiles bounds the files and folders under skills/, as
	// an install bounds an archive's entries.
	MaxSkillTreeFiles = 10000
	// MaxSkillTreeBytes bounds the bytes of every file under skills/
	// together, as an install bounds what it extracts.
	MaxSkillTreeBytes = 256 << 20
)

// SkillFiles is the SHA-256 of every file under a plugin's skills/
// folder, by its slash path from the plugin folder (skills/<skill>/...).
type SkillFiles map[string][sha256.Size]byte

// Digest is what skills_sha256 holds for these files: the SHA-256, in
// lower-case hexadecimal, of one line "<hex SHA-256>  <path>\n" a file,
// in byte order of path (what `sha256sum` prints, sorted). Folders are
// not covered, only the files in them. Nil (no skills/ read) is "".
func (f SkillFiles) Digest() string {
	if f == nil {
		return ""
	}
	paths := make([]string, 0, len(f))
	for p := range f {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	h := sha256.New()
	for _, p := range paths {
		sum := f[p]
		fmt.Fprintf(h, "%s  %s\n", hex.EncodeToString(sum[:]), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SkillFileOf is the key of SkillFiles for the file at rel (a slash
// path) inside skill sk's folder.
func SkillFileOf(sk Skill, rel string) string { return SkillsDir + "/" + sk.Name + "/" + rel }

// ReadSkillFiles hashes every file under the bundle's skills/ folder,
// read through the plugin folder as an os.Root: a symbolic link, or
// anything but a folder or a regular file, is refused (as LoadSkills
// and ReadSkill refuse them), and so are more than MaxSkillTreeFiles
// entries or MaxSkillTreeBytes bytes.
func (b *Bundle) ReadSkillFiles() (SkillFiles, error) {
	root, err := os.OpenRoot(b.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLayout, SkillsDir, err)
	}
	defer root.Close()
	files := SkillFiles{}
	var entries int
	var total int64
	err = fs.WalkDir(root.FS(), SkillsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if entries++; entries > MaxSkillTreeFiles {
			return fmt.Errorf("more than %d files and folders", MaxSkillTreeFiles)
		}
		// A path is one line of what Digest hashes: a newline in a
		// name would let one tree's lines read as another's.
		if strings.ContainsFunc(p, unicode.IsControl) {
			return fmt.Errorf("%q: a name holds a control character", p)
		}
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file or a folder (a symbolic link?)", p)
		}
		f, err := root.OpenFile(filepath.FromSlash(p), os.O_RDONLY|oNonBlock|oNoFollow, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		h := sha256.New()
		n, err := io.Copy(h, io.LimitReader(f, MaxSkillTreeBytes-total+1))
		if err != nil {
			return err
		}
		if total += n; total > MaxSkillTreeBytes {
			return fmt.Errorf("its files hold more than %d bytes", MaxSkillTreeBytes)
		}
		files[p] = [sha256.Size]byte(h.Sum(nil))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLayout, SkillsDir, err)
	}
	return files, nil
}
