package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

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
