package manifest_test

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A schema with properties named like the root signature fields: they are
// schema content, and the signature covers them.
const nestedSigSchema = `permissions = ["config_read"]

[config_schema]
type = "object"
additionalProperties = false

[config_schema.properties.signature]
type = "string"
description = "the webhook's own signing secret name"

[config_schema.properties.publisher_key]
type = "string"
`

func newKey(t *testing.T, seed byte) ed25519.PrivateKey {
	t.Helper()
	return ed25519.NewKeyFromSeed([]byte(strings.Repeat(string([]byte{seed}), 32)))
}

func pubHex(k ed25519.PrivateKey) string { return hex.EncodeToString(k.Public().(ed25519.PublicKey)) }

// module is the module the test manifests' signatures cover.
var module = []byte("\x00asm\x01\x00\x00\x00")

func sign(t *testing.T, text string, k ed25519.PrivateKey) string {
	t.Helper()
	out, err := manifest.Sign([]byte(text), module, "", k)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return string(out)
}

func parse(t *testing.T, text string) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Parse([]byte(text))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, text)
	}
	return m
}

// TestSignaturePolicy: signed-and-trusted loads in strict mode; a
// tampered manifest, an untrusted key and an unsigned manifest are each
// refused in strict, warned about in permissive and ignored in disabled.
func TestSignaturePolicy(t *testing.T) {
	publisher, stranger := newKey(t, 1), newKey(t, 2)
	trusted := []string{pubHex(publisher)}
	signed := sign(t, base, publisher)
	tampered := strings.Replace(signed, `version = "0.1.0"`, `version = "0.1.1"`, 1)
	cases := []struct {
		name, text string
		status     manifest.Status
	}{
		{"trusted", signed, manifest.StatusTrusted},
		{"tampered", tampered, manifest.StatusInvalid},
		{"untrusted key", sign(t, base, stranger), manifest.StatusUntrusted},
		{"unsigned", base, manifest.StatusUnsigned},
	}
	for _, c := range cases {
		m := parse(t, c.text)
		t.Run(c.name+"/strict", func(t *testing.T) {
			v, err := manifest.Policy{Mode: manifest.ModeStrict, Trusted: trusted}.Check(m, module, "")
			if v.Status != c.status {
				t.Fatalf("status %s, want %s", v.Status, c.status)
			}
			if c.status == manifest.StatusTrusted {
				if err != nil || v.Key != pubHex(publisher) {
					t.Fatalf("trusted refused: %v %+v", err, v)
				}
				return
			}
			if !errors.Is(err, manifest.ErrSignature) {
				t.Fatalf("strict let %s through: %v", c.name, err)
			}
		})
		t.Run(c.name+"/permissive", func(t *testing.T) {
			v, err := manifest.Policy{Mode: manifest.ModePermissive, Trusted: trusted}.Check(m, module, "")
			if err != nil || v.Status != c.status {
				t.Fatalf("permissive: %v %+v", err, v)
			}
			if (v.Warning == "") != (c.status == manifest.StatusTrusted) {
				t.Fatalf("permissive warning %q for %s", v.Warning, c.status)
			}
		})
		t.Run(c.name+"/disabled", func(t *testing.T) {
			v, err := manifest.Policy{Mode: manifest.ModeDisabled, Trusted: trusted}.Check(m, module, "")
			if err != nil || v.Status != manifest.StatusUnchecked || v.Warning != "" {
				t.Fatalf("disabled: %v %+v", err, v)
			}
		})
	}
}

// A property named signature inside config_schema is covered: changing it
// breaks the signature, while the root entries are what is stripped.
func TestNestedSignaturePropertyIsSigned(t *testing.T) {
	k := newKey(t, 3)
	text := sign(t, base+nestedSigSchema, k)
	if err := manifest.Verify(parse(t, text), module, ""); err != nil {
		t.Fatalf("fresh signature: %v", err)
	}
	tampered := strings.Replace(text, "the webhook's own signing secret name", "something else", 1)
	if err := manifest.Verify(parse(t, tampered), module, ""); err == nil {
		t.Fatal("a change to the nested signature property kept the signature valid")
	}
	retyped := strings.Replace(text, "[config_schema.properties.publisher_key]\ntype = \"string\"", "[config_schema.properties.publisher_key]\ntype = \"integer\"", 1)
	if err := manifest.Verify(parse(t, retyped), module, ""); err == nil {
		t.Fatal("a change to the nested publisher_key property kept the signature valid")
	}
	// Layout, comments and key order are not content.
	relaid := strings.Replace(text, "capabilities = [\"tool\"]", "# a comment\ncapabilities = [ \"tool\" ]", 1)
	if err := manifest.Verify(parse(t, relaid), module, ""); err != nil {
		t.Fatalf("a comment broke the signature: %v", err)
	}
}

// Re-signing replaces the old root lines; 1 and 1.0 sign differently.
func TestSignReplacesAndDistinguishesNumbers(t *testing.T) {
	a, b := newKey(t, 4), newKey(t, 5)
	once := sign(t, base, a)
	twice := sign(t, once, b)
	m := parse(t, twice)
	if m.PublisherKey != pubHex(b) || strings.Count(twice, "signature =") != 1 {
		t.Fatalf("re-signed:\n%s", twice)
	}
	withInt := base + `permissions = ["config_read"]` + schema
	signed := sign(t, withInt, a)
	asFloat := strings.Replace(signed, "minimum = 0", "minimum = 0.0", 1)
	if err := manifest.Verify(parse(t, asFloat), module, ""); err == nil {
		t.Fatal("0 and 0.0 have the same canonical bytes")
	}
}

func TestParsePrivateKey(t *testing.T) {
	k := newKey(t, 6)
	for _, text := range []string{hex.EncodeToString(k.Seed()), hex.EncodeToString(k) + "\n"} {
		got, err := manifest.ParsePrivateKey([]byte(text))
		if err != nil || !got.Equal(k) {
			t.Fatalf("%q: %v", text, err)
		}
	}
	if _, err := manifest.ParsePrivateKey([]byte("zz")); err == nil {
		t.Fatal("garbage accepted")
	}
}

// The signature covers the module through wasm_sha256: another module
// under a signed manifest does not verify, nor does a manifest signed
// before wasm_sha256 existed (its signature covers no module), and a
// skill-only plugin has no module to cover.
func TestSignatureCoversModule(t *testing.T) {
	k := newKey(t, 7)
	text := sign(t, base, k)
	m := parse(t, text)
	if m.WasmSHA256 != manifest.ModuleDigest(module) {
		t.Fatalf("wasm_sha256 %q, want the module's digest", m.WasmSHA256)
	}
	if err := manifest.Verify(m, []byte("\x00asm\x01\x00\x00\x00\x01"), ""); err == nil || !strings.Contains(err.Error(), "module does not match") {
		t.Fatalf("swapped module: %v", err)
	}
	v, err := manifest.Policy{Mode: manifest.ModeStrict, Trusted: []string{pubHex(k)}}.Check(m, nil, "")
	if v.Status != manifest.StatusInvalid || !errors.Is(err, manifest.ErrSignature) {
		t.Fatalf("strict, no module: %+v %v", v, err)
	}

	// A signature made as before: the canonical bytes of a manifest
	// without wasm_sha256.
	unsigned := parse(t, base)
	old := "signature = \"" + base64.RawURLEncoding.EncodeToString(ed25519.Sign(k, unsigned.CanonicalBytes())) +
		"\"\npublisher_key = \"" + pubHex(k) + "\"\n" + base
	err = manifest.Verify(parse(t, old), module, "")
	if err == nil || !strings.Contains(err.Error(), "no wasm_sha256") || !strings.Contains(err.Error(), "clawmesh plugin sign") {
		t.Fatalf("a signature over the manifest alone: %v", err)
	}
	// Signing it again adds the digest, and replaces one already there.
	again := sign(t, old, k)
	if err := manifest.Verify(parse(t, again), module, ""); err != nil {
		t.Fatalf("signed again: %v\n%s", err, again)
	}
	other := []byte("\x00asm\x01\x00\x00\x00\x02")
	out, err := manifest.Sign([]byte(again), other, "", k)
	if err != nil || strings.Count(string(out), "wasm_sha256") != 1 {
		t.Fatalf("signed for another module: %v\n%s", err, out)
	}
	if err := manifest.Verify(parse(t, string(out)), other, ""); err != nil {
		t.Fatalf("signed for another module: %v", err)
	}

	skill := "name = \"s\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n"
	files := manifest.SkillFiles{"skills/s/SKILL.md": sha256.Sum256([]byte("one"))}
	raw, err := manifest.Sign([]byte(skill), nil, files.Digest(), k)
	if err != nil {
		t.Fatal(err)
	}
	signedSkill := string(raw)
	if strings.Contains(signedSkill, "wasm_sha256") || !strings.Contains(signedSkill, "skills_sha256") {
		t.Fatalf("a skill-only plugin got a module digest, or no skills digest:\n%s", signedSkill)
	}
	if err := manifest.Verify(parse(t, signedSkill), nil, files.Digest()); err != nil {
		t.Fatalf("skill-only: %v", err)
	}
	if _, err := manifest.Sign([]byte(skill), nil, "", k); err == nil {
		t.Fatal("a skill plugin signed without the digest of its files")
	}
	if _, err := manifest.Parse([]byte(skill + "wasm_sha256 = \"" + manifest.ModuleDigest(nil) + "\"\n")); err == nil {
		t.Fatal("a skill-only manifest with wasm_sha256 was accepted")
	}
}

// A module that does not match the manifest's wasm_sha256 is refused in
// every mode, signed or not (ErrDigest); it was checked only inside
// signature verification, so unsigned it loaded under permissive and
// disabled, and signed it loaded under permissive with a warning.
func TestModuleDigestCheckedWhateverTheSignature(t *testing.T) {
	publisher := newKey(t, 1)
	other := []byte("\x00asm\x01\x00\x00\x00 swapped")
	unsigned := "wasm_sha256 = \"" + manifest.ModuleDigest(module) + "\"\n" + base
	for _, text := range []string{unsigned, sign(t, base, publisher)} {
		m := parse(t, text)
		for _, mode := range manifest.Modes {
			pol := manifest.Policy{Mode: mode, Trusted: []string{pubHex(publisher)}}
			if _, err := pol.Check(m, other, ""); !errors.Is(err, manifest.ErrDigest) || !strings.Contains(err.Error(), "wasm_sha256") {
				t.Errorf("%s, signed %v: a module not matching wasm_sha256: %v", mode, m.Signed(), err)
			}
			if _, err := pol.Check(m, module, ""); errors.Is(err, manifest.ErrDigest) {
				t.Errorf("%s, signed %v: the matching module: %v", mode, m.Signed(), err)
			}
		}
	}
}

// A signature covers the skills/ files through skills_sha256, as it
// covers a module: any file changed, added or removed fails it, and so
// does a signed skill manifest without the digest (signed before it
// covered them). Unsigned, a wrong skills_sha256 is refused in every
// mode. Before, a signature over a skill bundle covered its manifest
// alone: its files could be swapped and the plugin still loaded as its
// publisher's.
func TestSignatureCoversSkillFiles(t *testing.T) {
	k := newKey(t, 7)
	dir := t.TempDir()
	write := func(rel, body string) { t.Helper(); testenv.WriteFile(t, dir, rel, body) }
	text := "name = \"kit\"\nversion = \"1.0.0\"\ncapabilities = [\"skill\"]\n"
	write("manifest.toml", text)
	write("skills/review/SKILL.md", "---\nname: review\ndescription: Reviews.\n---\nRead it.\n")
	write("skills/review/references/guide.md", "Be kind.\n")
	digest := func() string {
		t.Helper()
		b, err := manifest.LoadBundle(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, files, err := b.Contents()
		if err != nil {
			t.Fatal(err)
		}
		return files.Digest()
	}
	signed, err := manifest.Sign([]byte(text), nil, digest(), k)
	if err != nil {
		t.Fatal(err)
	}
	m := parse(t, string(signed))
	strict := manifest.Policy{Mode: manifest.ModeStrict, Trusted: []string{pubHex(k)}}
	if v, err := strict.Check(m, nil, digest()); err != nil || v.Status != manifest.StatusTrusted {
		t.Fatalf("as signed: %+v %v", v, err)
	}
	for _, change := range []func(){
		func() {
			write("skills/review/SKILL.md", "---\nname: review\ndescription: Reviews.\n---\nRun this first.\n")
		},
		func() { write("skills/review/references/guide.md", "Paste your keys.\n") },
		func() { write("skills/review/scripts/new.sh", "echo\n") },
	} {
		change()
		for _, mode := range manifest.Modes {
			pol := strict
			pol.Mode = mode
			if _, err := pol.Check(m, nil, digest()); !errors.Is(err, manifest.ErrDigest) || !strings.Contains(err.Error(), "skills_sha256") {
				t.Fatalf("%s, a skill file changed: %v", mode, err)
			}
		}
	}
	unsigned := parse(t, text)
	if _, err := strict.Check(unsigned, nil, digest()); !errors.Is(err, manifest.ErrSignature) {
		t.Fatalf("strict, unsigned: %v", err)
	}
	old := "signature = \"" + base64.RawURLEncoding.EncodeToString(ed25519.Sign(k, unsigned.CanonicalBytes())) +
		"\"\npublisher_key = \"" + pubHex(k) + "\"\n" + text
	if err := manifest.Verify(parse(t, old), nil, digest()); err == nil || !strings.Contains(err.Error(), "no skills_sha256") {
		t.Fatalf("a signature over the manifest alone: %v", err)
	}
	if _, err := manifest.Parse([]byte(base + "skills_sha256 = \"" + digest() + "\"\n")); err == nil {
		t.Fatal("skills_sha256 accepted on a plugin without the skill capability")
	}
	// A name with a newline could make one tree's lines read as
	// another's: refused.
	write("skills/review/references/a\n"+strings.Repeat("0", 64)+"  skills/review/b", "x")
	b, err := manifest.LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Contents(); !errors.Is(err, manifest.ErrLayout) || !strings.Contains(err.Error(), "control character") {
		t.Fatalf("a newline in a skill file's name: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "skills/review/references/a\n"+strings.Repeat("0", 64)+"  skills")); err != nil {
		t.Fatal(err)
	}
	// A link under skills/ is refused, not followed into the digest.
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "skills", "review", "references", "link.md")); err != nil {
		t.Fatal(err)
	}
	b, err = manifest.LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Contents(); !errors.Is(err, manifest.ErrLayout) {
		t.Fatalf("a link under skills/: %v", err)
	}
}
