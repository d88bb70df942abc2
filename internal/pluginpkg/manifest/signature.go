package manifest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// SigningDomain prefixes the canonical bytes, so a manifest signature can
// never be replayed as a signature over anything else.
const SigningDomain = "clawmesh-plugin-manifest-v1\n"

// CanonicalBytes are the bytes a manifest signature covers: SigningDomain
// followed by the parsed document, without the two root entries
// signature and publisher_key (entries of those names anywhere else, such
// as config_schema properties, stay covered), in a canonical JSON form:
// object keys sorted by byte order, no insignificant space, strings as
// encoding/json writes them (HTML characters unescaped), integers in
// decimal, floats always with a fraction or an exponent so that 1 and 1.0
// stay distinct. Comments, key order, quoting and layout of the TOML file
// are not covered: they carry no meaning. The root entries wasm_sha256
// and skills_sha256 are covered: they are how a signature covers the
// module's bytes and the skills/ files.
func (m *Manifest) CanonicalBytes() []byte {
	return m.canonical(fieldSignature, fieldPublisherKey)
}

// canonical is CanonicalBytes without the root entries named.
func (m *Manifest) canonical(without ...string) []byte {
	doc := make(map[string]any, len(m.doc))
	for k, v := range m.doc {
		if slices.Contains(without, k) {
			continue
		}
		doc[k] = v
	}
	var b bytes.Buffer
	b.WriteString(SigningDomain)
	writeCanonical(&b, doc)
	return b.Bytes()
}

// ModuleDigest is what wasm_sha256 holds for module: its SHA-256 in
// lower-case hexadecimal.
func ModuleDigest(module []byte) string {
	sum := sha256.Sum256(module)
	return hex.EncodeToString(sum[:])
}

func writeCanonical(b *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			writeCanonical(b, x[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, it := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, it)
		}
		b.WriteByte(']')
	case []map[string]any:
		b.WriteByte('[')
		for i, it := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, it)
		}
		b.WriteByte(']')
	case string:
		writeString(b, x)
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		b.WriteString(s)
	case bool:
		b.WriteString(strconv.FormatBool(x))
	default:
		// Parse refuses every other value (checkValues).
		panic(fmt.Sprintf("manifest: canonical form of %T", v))
	}
}

func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	b.Truncate(b.Len() - 1) // the encoder's newline
}

// decodeSignature reads a base64url signature, with or without padding.
func decodeSignature(s string) ([]byte, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return nil, fmt.Errorf("must be base64url: %w", err)
	}
	if len(raw) != ed25519.SignatureSize {
		return nil, fmt.Errorf("an Ed25519 signature is %d bytes, not %d", ed25519.SignatureSize, len(raw))
	}
	return raw, nil
}

// Mode is plugins.security.signature_mode.
type Mode string

// Signature modes.
const (
	// ModeDisabled ignores signatures.
	ModeDisabled Mode = "disabled"
	// ModePermissive checks signatures and warns about any that is
	// missing, invalid or untrusted, and loads the plugin anyway.
	ModePermissive Mode = "permissive"
	// ModeStrict refuses any plugin not signed by a trusted key.
	ModeStrict Mode = "strict"
)

// Modes lists the modes.
var Modes = []Mode{ModeDisabled, ModePermissive, ModeStrict}

// Status is the outcome of checking one manifest's signature.
type Status string

// Statuses.
const (
	// StatusUnchecked: signature_mode is disabled.
	StatusUnchecked Status = "unchecked"
	// StatusUnsigned: no signature.
	StatusUnsigned Status = "unsigned"
	// StatusInvalid: the signature does not verify (a tampered manifest).
	StatusInvalid Status = "invalid"
	// StatusUntrusted: it verifies, under a key not in
	// trusted_publisher_keys.
	StatusUntrusted Status = "untrusted"
	// StatusTrusted: it verifies under a trusted key.
	StatusTrusted Status = "trusted"
)

// Policy is plugins.security: the mode and the trusted publisher keys
// (hexadecimal Ed25519 public keys).
type Policy struct {
	Mode    Mode
	Trusted []string
}

// DefaultPolicy is the schema's default: permissive, no trusted keys.
func DefaultPolicy() Policy { return Policy{Mode: ModePermissive} }

// Validate checks the mode and the keys.
func (p Policy) Validate() error {
	if !slices.Contains(Modes, p.Mode) {
		return fmt.Errorf("%w: plugins.security.signature_mode %q must be disabled, permissive or strict", ErrSignature, p.Mode)
	}
	for _, k := range p.Trusted {
		if !hexKey.MatchString(k) {
			return fmt.Errorf("%w: plugins.security.trusted_publisher_keys: %q is not a 64-character hexadecimal key", ErrSignature, k)
		}
	}
	return nil
}

// Verdict is what a policy decided about one manifest.
type Verdict struct {
	Status Status
	// Key is the publisher key whose signature verified (empty otherwise).
	Key string
	// Warning, in permissive mode, says why the plugin loads unverified.
	Warning string
}

// Verified reports whether the signature verified (trusted or not).
func (v Verdict) Verified() bool { return v.Status == StatusTrusted || v.Status == StatusUntrusted }

// Verify checks m's signature against its publisher key and, unless the
// plugin is skill-only, module (the bytes at wasm_path) against the
// wasm_sha256 the signature covers; for a plugin with the skill
// capability, skills (SkillFiles.Digest of its skills/ folder) against
// skills_sha256 likewise. A signature over the manifest alone let anyone
// swap the module or the skill files of a signed plugin, in the package
// before install or in the folder after, and the plugin still verified
// as its publisher's; a signed manifest without the digest (made before
// signatures covered the files) is therefore refused, with a word on how
// to sign it again.
func Verify(m *Manifest, module []byte, skills string) error {
	if !m.Signed() {
		return errors.New("the manifest is not signed")
	}
	sig, err := decodeSignature(m.Signature)
	if err != nil {
		return err
	}
	key, err := hex.DecodeString(m.PublisherKey)
	if err != nil || len(key) != ed25519.PublicKeySize {
		return errors.New("publisher_key is not an Ed25519 public key")
	}
	if !ed25519.Verify(ed25519.PublicKey(key), m.CanonicalBytes(), sig) {
		return errors.New("the signature does not match the manifest")
	}
	if m.Has(CapSkill) {
		if m.SkillsSHA256 == "" {
			return errors.New("the signature does not cover the skills/ files: the manifest has no skills_sha256 (signed before signatures covered them); sign it again with `clawmesh plugin sign`")
		}
		if skills != m.SkillsSHA256 {
			return fmt.Errorf("the skills/ files do not match the signed manifest: their digest is %s, skills_sha256 says %s (changed after signing?)", skills, m.SkillsSHA256)
		}
	}
	if m.WasmPath == "" {
		return nil
	}
	if m.WasmSHA256 == "" {
		return errors.New("the signature does not cover the module: the manifest has no wasm_sha256 (signed before signatures covered the module); sign it again with `clawmesh plugin sign`")
	}
	if got := ModuleDigest(module); got != m.WasmSHA256 {
		return fmt.Errorf("the module does not match the signed manifest: its SHA-256 is %s, wasm_sha256 says %s (changed after signing?)", got, m.WasmSHA256)
	}
	return nil
}

// CheckDigests refuses a module that does not match the manifest's
// wasm_sha256, and skills/ files (skills, their digest) that do not
// match its skills_sha256, signed or not: a digest is the package's own
// word on its files, and a mismatch means a broken or tampered package
// whichever signature_mode is in force. A digest left out asserts
// nothing here.
func CheckDigests(m *Manifest, module []byte, skills string) error {
	if m.WasmPath != "" && m.WasmSHA256 != "" {
		if got := ModuleDigest(module); got != m.WasmSHA256 {
			return fmt.Errorf("%w: the module at %s has SHA-256 %s, but the manifest's wasm_sha256 says %s (a broken or tampered package; refused whatever signature_mode)",
				ErrDigest, m.WasmPath, got, m.WasmSHA256)
		}
	}
	if m.Has(CapSkill) && m.SkillsSHA256 != "" && skills != m.SkillsSHA256 {
		return fmt.Errorf("%w: the skills/ files have digest %s, but the manifest's skills_sha256 says %s (a broken or tampered package; refused whatever signature_mode)",
			ErrDigest, skills, m.SkillsSHA256)
	}
	return nil
}

// Check applies the policy to m, its module (nil for a skill-only
// plugin) and its skills/ files' digest (SkillFiles.Digest; "" without
// the skill capability). Files that do not match wasm_sha256 or
// skills_sha256 are an error wrapping ErrDigest in every mode
// (CheckDigests). Otherwise, in strict mode
// anything but a signature verified under a trusted key is an error
// wrapping ErrSignature; in permissive mode the verdict carries a
// warning instead; in disabled mode nothing is checked.
func (p Policy) Check(m *Manifest, module []byte, skills string) (Verdict, error) {
	v, err := p.check(m, module, skills)
	// Before the policy's verdict: permissive and disabled load what is
	// unsigned or wrongly signed, never what its own digests disown.
	if derr := CheckDigests(m, module, skills); derr != nil {
		if err != nil {
			// Strict refused it too: both are said, and both match.
			return v, fmt.Errorf("%w; and %w", derr, err)
		}
		return v, derr
	}
	return v, err
}

func (p Policy) check(m *Manifest, module []byte, skills string) (Verdict, error) {
	if p.Mode == ModeDisabled {
		return Verdict{Status: StatusUnchecked}, nil
	}
	var v Verdict
	switch err := Verify(m, module, skills); {
	case !m.Signed():
		v = Verdict{Status: StatusUnsigned, Warning: "the manifest is not signed"}
	case err != nil:
		v = Verdict{Status: StatusInvalid, Warning: err.Error()}
	case !slices.ContainsFunc(p.Trusted, func(k string) bool { return strings.EqualFold(k, m.PublisherKey) }):
		v = Verdict{Status: StatusUntrusted, Key: m.PublisherKey,
			Warning: "publisher key " + m.PublisherKey + " is not in plugins.security.trusted_publisher_keys"}
	default:
		return Verdict{Status: StatusTrusted, Key: m.PublisherKey}, nil
	}
	if p.Mode == ModeStrict {
		return v, fmt.Errorf("%w: %s: %s (signature_mode strict)", ErrSignature, v.Status, v.Warning)
	}
	return v, nil
}

// rootSigLine matches a root-level signature, publisher_key,
// wasm_sha256 or skills_sha256 assignment.
var rootSigLine = regexp.MustCompile(`^\s*("?)(signature|publisher_key|wasm_sha256|skills_sha256)("?)\s*=`)

// Sign returns the manifest file text with a fresh signature, the
// publisher key of priv and, unless the plugin is skill-only, the
// wasm_sha256 of module (the bytes at wasm_path), and for a plugin with
// the skill capability skills_sha256 = skills (SkillFiles.Digest of its
// skills/ folder), which the signature covers. Root signature,
// publisher_key, wasm_sha256 and skills_sha256 lines already in the file
// are removed and the new ones are written first; the result is parsed
// and verified again before it is returned.
func Sign(data, module []byte, skills string, priv ed25519.PrivateKey) ([]byte, error) {
	m, err := Parse(data)
	if err != nil {
		return nil, err
	}
	var kept []string
	inRoot := true
	for _, line := range strings.SplitAfter(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "[") {
			inRoot = false
		}
		if inRoot && rootSigLine.MatchString(line) {
			continue
		}
		kept = append(kept, line)
	}
	body := strings.Join(kept, "")
	unsigned, err := Parse([]byte(body))
	if err != nil || unsigned.Signed() || unsigned.WasmSHA256 != "" || unsigned.SkillsSHA256 != "" {
		return nil, fmt.Errorf("%w: cannot remove the old signature lines; write signature, publisher_key, wasm_sha256 and skills_sha256 as plain one-line root keys", ErrInvalid)
	}
	if !bytes.Equal(unsigned.canonical(fieldWasmSHA256, fieldSkillsSHA256), m.canonical(fieldSignature, fieldPublisherKey, fieldWasmSHA256, fieldSkillsSHA256)) {
		return nil, fmt.Errorf("%w: removing the old signature lines changed the manifest", ErrInvalid)
	}
	head := ""
	if m.WasmPath != "" {
		head = fmt.Sprintf("wasm_sha256 = %q\n", ModuleDigest(module))
	}
	if m.Has(CapSkill) {
		if !hexKey.MatchString(skills) {
			return nil, fmt.Errorf("%w: no digest of the skills/ files to sign", ErrSignature)
		}
		head += fmt.Sprintf("skills_sha256 = %q\n", skills)
	}
	toSign, err := Parse([]byte(head + body))
	if err != nil {
		return nil, err
	}
	sig := ed25519.Sign(priv, toSign.CanonicalBytes())
	pub := priv.Public().(ed25519.PublicKey)
	out := fmt.Sprintf("signature = %q\npublisher_key = %q\n%s%s", base64.RawURLEncoding.EncodeToString(sig), hex.EncodeToString(pub), head, body)
	signed, err := Parse([]byte(out))
	if err != nil {
		return nil, err
	}
	if err := Verify(signed, module, skills); err != nil {
		return nil, fmt.Errorf("%w: the signed manifest does not verify: %v", ErrSignature, err)
	}
	return []byte(out), nil
}

// ParsePrivateKey reads an Ed25519 private key: a PEM PKCS#8 block (as
// `openssl genpkey -algorithm ed25519` writes), or hexadecimal text of the
// 32-byte seed or the 64-byte private key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	if block, _ := pem.Decode(data); block != nil {
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("key file: %w", err)
		}
		priv, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("key file: a %T, not an Ed25519 key", k)
		}
		return priv, nil
	}
	raw, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, errors.New("key file: neither PEM nor hexadecimal")
	}
	switch len(raw) {
	case ed25519.SeedSize:
		return ed25519.NewKeyFromSeed(raw), nil
	case ed25519.PrivateKeySize:
		priv := ed25519.PrivateKey(raw)
		if !bytes.Equal(ed25519.NewKeyFromSeed(raw[:32]), priv) {
			return nil, errors.New("key file: the 64-byte key is inconsistent")
		}
		return priv, nil
	}
	return nil, fmt.Errorf("key file: %d bytes; want a 32-byte seed or a 64-byte key", len(raw))
}
