// Package manifest parses and validates plugin manifests (manifest.toml),
// their config schemas, signatures and skill bundles, and materialises an
// operator's string values into the typed public config and the secrets
// of seed 003.
package manifest

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
	"github.com/Masterminds/semver/v3"
)

// Sentinel errors.
var (
	// ErrInvalid reports a manifest that breaks a validation rule. Errors
	// wrapping it are *FieldError values naming the field.
	ErrInvalid = errors.New("manifest: invalid")
	// ErrConfig reports operator values that do not fit the config schema.
	ErrConfig = errors.New("manifest: config rejected")
	// ErrSignature reports a manifest refused by the signature policy.
	ErrSignature = errors.New("manifest: signature refused")
	// ErrDigest reports content that does not match the digest its
	// manifest gives for it (wasm_sha256): a broken or tampered package,
	// refused whatever the signature policy.
	ErrDigest = errors.New("manifest: content does not match its digest")
	// ErrLayout reports a plugin directory that does not hold what its
	// manifest declares (the module, the skills bundle).
	ErrLayout = errors.New("manifest: plugin layout invalid")
)

// FieldError is a refusal of one manifest field. Field is the dotted path
// of the field ("version", "config_schema.properties.api_key.x-secret").
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("manifest: invalid %s: %s", e.Field, e.Reason)
}

// Unwrap makes every FieldError an ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// FileName is the manifest's file name inside a plugin directory.
const FileName = "manifest.toml"

// MaxBytes caps a manifest file.
const MaxBytes = 256 << 10

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

// Permissions. Only config_read and http_client have an effect; the others
// are accepted and grant nothing (Inert lists them).
const (
	PermHTTPClient  Permission = "http_client"
	PermConfigRead  Permission = "config_read"
	PermFileRead    Permission = "file_read"
	PermFileWrite   Permission = "file_write"
	PermMemoryRead  Permission = "memory_read"
	PermMemoryWrite Permission = "memory_write"
)

var (
	knownCaps  = []Capability{CapTool, CapChannel, CapMemory, CapObserver, CapSkill}
	knownPerms = []Permission{PermHTTPClient, PermConfigRead, PermFileRead, PermFileWrite, PermMemoryRead, PermMemoryWrite}
	// inertPerms are accepted by the schema but wired to no host import.
	inertPerms = []Permission{PermFileRead, PermFileWrite, PermMemoryRead, PermMemoryWrite}
	// NamePattern is what a plugin name may be: it becomes a folder name
	// and part of skill ids and instance keys.
	NamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	hexKey      = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// Root fields of manifest.toml.
const (
	fieldName         = "name"
	fieldVersion      = "version"
	fieldDescription  = "description"
	fieldAuthor       = "author"
	fieldWasmPath     = "wasm_path"
	fieldCapabilities = "capabilities"
	fieldPermissions  = "permissions"
	fieldConfigSchema = "config_schema"
	fieldSignature    = "signature"
	fieldPublisherKey = "publisher_key"
	fieldWasmSHA256   = "wasm_sha256"
	fieldSkillsSHA256 = "skills_sha256"
)

var rootFields = []string{fieldName, fieldVersion, fieldDescription, fieldAuthor, fieldWasmPath,
	fieldCapabilities, fieldPermissions, fieldConfigSchema, fieldSignature, fieldPublisherKey, fieldWasmSHA256, fieldSkillsSHA256}

// Manifest is the content of manifest.toml.
type Manifest struct {
	Name         string
	Version      string
	Description  string
	Author       string
	WasmPath     string
	Capabilities []Capability
	Permissions  []Permission
	ConfigSchema map[string]any
	// Signature is the base64url Ed25519 signature of the canonical bytes;
	// PublisherKey the hexadecimal public key (lower-cased).
	Signature    string
	PublisherKey string
	// WasmSHA256 is the hexadecimal SHA-256 of the module (lower-cased):
	// a root entry like any other, so the signature covers it, and
	// through it the module's bytes.
	WasmSHA256 string
	// SkillsSHA256 is SkillFiles.Digest of the skills/ folder
	// (lower-cased): what a signature covers a skill bundle's files by.
	SkillsSHA256 string

	version *semver.Version
	schema  *ConfigSchema
	// doc is the parsed document, for the canonical signing bytes.
	doc map[string]any
}

// Parse decodes and validates a manifest strictly: unknown keys, wrong
// types and broken rules are refused with a *FieldError naming the field.
func Parse(data []byte) (*Manifest, error) {
	if len(data) > MaxBytes {
		return nil, fieldErr("manifest", "is %d bytes; the limit is %d", len(data), MaxBytes)
	}
	if !utf8.Valid(data) {
		return nil, fieldErr("manifest", "is not UTF-8")
	}
	if err := checkNesting(data); err != nil {
		return nil, err
	}
	doc := map[string]any{}
	if _, err := toml.Decode(string(data), &doc); err != nil {
		return nil, fieldErr("manifest", "is not valid TOML: %v", tomlMessage(err))
	}
	if err := checkValues(doc); err != nil {
		return nil, err
	}
	m := &Manifest{doc: doc}
	for key := range doc {
		if !slices.Contains(rootFields, key) {
			return nil, fieldErr(keyName(key), "unknown field")
		}
	}
	var err error
	str := func(field string, dst *string) {
		if err != nil {
			return
		}
		v, ok := doc[field]
		if !ok {
			return
		}
		s, isStr := v.(string)
		if !isStr {
			err = fieldErr(field, "must be a string")
			return
		}
		*dst = s
	}
	list := func(field string) []string {
		if err != nil {
			return nil
		}
		v, ok := doc[field]
		if !ok {
			return nil
		}
		items, isList := v.([]any)
		if !isList {
			err = fieldErr(field, "must be an array of strings")
			return nil
		}
		out := make([]string, 0, len(items))
		for i, it := range items {
			s, isStr := it.(string)
			if !isStr {
				err = fieldErr(fmt.Sprintf("%s[%d]", field, i), "must be a string")
				return nil
			}
			out = append(out, s)
		}
		return out
	}
	str(fieldName, &m.Name)
	str(fieldVersion, &m.Version)
	str(fieldDescription, &m.Description)
	str(fieldAuthor, &m.Author)
	str(fieldWasmPath, &m.WasmPath)
	str(fieldSignature, &m.Signature)
	str(fieldPublisherKey, &m.PublisherKey)
	str(fieldWasmSHA256, &m.WasmSHA256)
	str(fieldSkillsSHA256, &m.SkillsSHA256)
	for _, c := range list(fieldCapabilities) {
		m.Capabilities = append(m.Capabilities, Capability(c))
	}
	for _, p := range list(fieldPermissions) {
		m.Permissions = append(m.Permissions, Permission(p))
	}
	if err != nil {
		return nil, err
	}
	if v, ok := doc[fieldConfigSchema]; ok {
		tbl, isTable := v.(map[string]any)
		if !isTable {
			return nil, fieldErr(fieldConfigSchema, "must be a table")
		}
		m.ConfigSchema = tbl
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// tomlMessage is the decoder's message with its position, on one line.
func tomlMessage(err error) string {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		return fmt.Sprintf("line %d: %s", pe.Position.Line, pe.Message)
	}
	return err.Error()
}

// checkValues refuses values a JSON Schema and the canonical signing
// bytes cannot carry: TOML datetimes and non-finite floats.
func checkValues(doc map[string]any) error {
	rev, reason := badValue(doc)
	if reason == "" {
		return nil
	}
	var b strings.Builder
	for i := len(rev) - 1; i >= 0; i-- {
		if !rev[i].index && b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(rev[i].s)
	}
	return fieldErr(b.String(), "%s", reason)
}

// pathPart is one step of a value's path: a key (already quoted as
// keyName does) or an index ("[3]").
type pathPart struct {
	s     string
	index bool
}

// badValue returns why v, or a value inside it, cannot be carried ("" when
// all can), with the path to it innermost first. The path is built on the
// way out of a refusal only: building it on the way in would cost every
// level the length of the path above it.
func badValue(v any) (rev []pathPart, reason string) {
	switch x := v.(type) {
	case map[string]any:
		for k, child := range x {
			if rev, reason = badValue(child); reason != "" {
				return append(rev, pathPart{s: keyName(k)}), reason
			}
		}
	case []any:
		for i, child := range x {
			if rev, reason = badValue(child); reason != "" {
				return append(rev, pathPart{s: "[" + strconv.Itoa(i) + "]", index: true}), reason
			}
		}
	case []map[string]any:
		for i, child := range x {
			if rev, reason = badValue(child); reason != "" {
				return append(rev, pathPart{s: "[" + strconv.Itoa(i) + "]", index: true}), reason
			}
		}
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, "must be a finite number"
		}
	case time.Time:
		return nil, "datetimes are not allowed"
	case string, int64, bool:
	default:
		return nil, fmt.Sprintf("unsupported value of type %T", v)
	}
	return nil, ""
}

// keyName is how a refusal names a key: quoted when it is empty or holds
// a dot, a space or a control character.
func keyName(k string) string {
	if k == "" || strings.ContainsFunc(k, func(r rune) bool { return r == '.' || r <= ' ' || r == 0x7f }) {
		return strconv.Quote(k)
	}
	return k
}

// Load reads dir/manifest.toml.
func Load(dir string) (*Manifest, error) {
	data, err := ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// ReadFile reads a manifest file, refusing a symbolic link, a non-regular
// file and one over MaxBytes.
func ReadFile(file string) ([]byte, error) {
	fi, err := os.Lstat(file)
	if err != nil {
		return nil, fmt.Errorf("manifest: read: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrLayout, FileName)
	}
	if fi.Size() > MaxBytes {
		return nil, fieldErr("manifest", "is %d bytes; the limit is %d", fi.Size(), MaxBytes)
	}
	data, err := readRegular(file, MaxBytes, openNoFollow)
	if err != nil {
		return nil, fmt.Errorf("manifest: read: %w", err)
	}
	return data, nil
}

// Has reports whether the manifest declares the capability.
func (m *Manifest) Has(c Capability) bool { return slices.Contains(m.Capabilities, c) }

// Requests reports whether the manifest declares the permission.
func (m *Manifest) Requests(p Permission) bool { return slices.Contains(m.Permissions, p) }

// SkillOnly reports whether skill is the manifest's only capability: a
// markdown bundle with no module.
func (m *Manifest) SkillOnly() bool {
	return len(m.Capabilities) == 1 && m.Capabilities[0] == CapSkill
}

// Inert lists the declared permissions that are accepted but wired to no
// host import: declaring them grants nothing.
func (m *Manifest) Inert() []Permission {
	var out []Permission
	for _, p := range m.Permissions {
		if slices.Contains(inertPerms, p) {
			out = append(out, p)
		}
	}
	return out
}

// Schema returns the compiled config schema, or nil when none is declared.
func (m *Manifest) Schema() *ConfigSchema { return m.schema }

// SemVer returns the parsed version.
func (m *Manifest) SemVer() *semver.Version { return m.version }

// Signed reports whether the manifest carries a signature (verified or not).
func (m *Manifest) Signed() bool { return m.Signature != "" }

func (m *Manifest) validate() error {
	if m.Name == "" {
		return fieldErr(fieldName, "is required")
	}
	if !NamePattern.MatchString(m.Name) {
		return fieldErr(fieldName, "%q must match %s", m.Name, NamePattern)
	}
	if m.Version == "" {
		return fieldErr(fieldVersion, "is required")
	}
	v, err := semver.StrictNewVersion(m.Version)
	if err != nil {
		return fieldErr(fieldVersion, "%q is not a semantic version (MAJOR.MINOR.PATCH): %v", m.Version, err)
	}
	m.version = v
	if err := shortText(fieldDescription, m.Description, 1024); err != nil {
		return err
	}
	if err := shortText(fieldAuthor, m.Author, 256); err != nil {
		return err
	}
	if len(m.Capabilities) == 0 {
		return fieldErr(fieldCapabilities, "must list at least one capability")
	}
	for i, c := range m.Capabilities {
		if !slices.Contains(knownCaps, c) {
			return fieldErr(fmt.Sprintf("%s[%d]", fieldCapabilities, i), "unknown capability %q", c)
		}
		if slices.Index(m.Capabilities, c) != i {
			return fieldErr(fmt.Sprintf("%s[%d]", fieldCapabilities, i), "capability %q listed twice", c)
		}
	}
	switch {
	case m.SkillOnly() && m.WasmPath != "":
		return fieldErr(fieldWasmPath, "a skill-only plugin carries no module")
	case !m.SkillOnly() && m.WasmPath == "":
		return fieldErr(fieldWasmPath, "is required unless skill is the only capability")
	case m.WasmPath != "" && !localPath(m.WasmPath):
		return fieldErr(fieldWasmPath, "%q must be a relative path inside the plugin directory", m.WasmPath)
	}
	for i, p := range m.Permissions {
		if !slices.Contains(knownPerms, p) {
			return fieldErr(fmt.Sprintf("%s[%d]", fieldPermissions, i), "unknown permission %q", p)
		}
		if slices.Index(m.Permissions, p) != i {
			return fieldErr(fmt.Sprintf("%s[%d]", fieldPermissions, i), "permission %q listed twice", p)
		}
	}
	hasSchema := m.ConfigSchema != nil
	switch {
	case m.Requests(PermConfigRead) && !hasSchema:
		return fieldErr(fieldPermissions, "config_read requires a config_schema")
	case hasSchema && !m.Requests(PermConfigRead):
		return fieldErr(fieldConfigSchema, "requires the config_read permission")
	case hasSchema && !m.Has(CapTool) && !m.Has(CapChannel):
		return fieldErr(fieldPermissions, "config_read: only tool and channel plugins have a config import")
	}
	if hasSchema {
		s, err := CompileSchema(m.ConfigSchema)
		if err != nil {
			return err
		}
		m.schema = s
	}
	return m.validateSignatureFields()
}

func (m *Manifest) validateSignatureFields() error {
	if m.WasmSHA256 != "" {
		if m.WasmPath == "" {
			return fieldErr(fieldWasmSHA256, "a skill-only plugin carries no module")
		}
		if !hexKey.MatchString(m.WasmSHA256) {
			return fieldErr(fieldWasmSHA256, "must be a SHA-256 digest in hexadecimal (64 characters)")
		}
		m.WasmSHA256 = strings.ToLower(m.WasmSHA256)
	}
	if m.SkillsSHA256 != "" {
		if !m.Has(CapSkill) {
			return fieldErr(fieldSkillsSHA256, "only a plugin with the skill capability has skills/ files to cover")
		}
		if !hexKey.MatchString(m.SkillsSHA256) {
			return fieldErr(fieldSkillsSHA256, "must be a SHA-256 digest in hexadecimal (64 characters)")
		}
		m.SkillsSHA256 = strings.ToLower(m.SkillsSHA256)
	}
	switch {
	case m.Signature == "" && m.PublisherKey == "":
		return nil
	case m.Signature == "":
		return fieldErr(fieldSignature, "is required with publisher_key")
	case m.PublisherKey == "":
		return fieldErr(fieldPublisherKey, "is required with signature")
	}
	if !hexKey.MatchString(m.PublisherKey) {
		return fieldErr(fieldPublisherKey, "must be a 32-byte Ed25519 public key in hexadecimal (64 characters)")
	}
	m.PublisherKey = strings.ToLower(m.PublisherKey)
	if _, err := decodeSignature(m.Signature); err != nil {
		return fieldErr(fieldSignature, "%v", err)
	}
	return nil
}

// shortText bounds a free-text field and refuses control characters.
func shortText(field, s string, limit int) error {
	if len(s) > limit {
		return fieldErr(field, "is %d bytes; the limit is %d", len(s), limit)
	}
	for _, r := range s {
		if r < 0x20 && r != '\t' && r != '\n' || r == 0x7f {
			return fieldErr(field, "contains a control character")
		}
	}
	return nil
}

// localPath reports whether p (slash-separated) names a file inside its
// directory: relative, no "..", no backslash, no drive letter.
func localPath(p string) bool {
	if strings.ContainsAny(p, "\\\x00:") || strings.HasPrefix(p, "/") {
		return false
	}
	clean := path.Clean(p)
	return clean == p && clean != "." && !strings.HasPrefix(clean, "../") && clean != ".." && filepath.IsLocal(filepath.FromSlash(p))
}
