package config

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/datadir"
)

// KeyFileName is the AES-256 key that encrypts secrets at rest, in the
// data directory, created 0600 on first run.
var KeyFileName = filepath.Base(datadir.SecretKey(""))

// encPrefix marks an encrypted value in the stored document.
const encPrefix = "enc:v1:"

// sealer encrypts secret values with AES-GCM; the property path is the
// additional data, so a ciphertext cannot be moved to another property.
type sealer struct{ aead cipher.AEAD }

// loadKey reads the key file in dir, creating it (0600, 32 random bytes)
// when it does not exist. The key is written whole to a temporary file and
// linked into place, so the key file is never seen part-written: created
// first and written after, a failed write (a full disk, a crash between
// the two) left an empty key file that failed every later start. An empty
// key file, which only such a creation can have left, so nothing was ever
// sealed with it, is made anew.
func loadKey(dir string) (*sealer, error) {
	path := filepath.Join(dir, KeyFileName)
	key, err := os.ReadFile(path)
	if err == nil && len(key) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("secret key: %w", err)
		}
		err = fs.ErrNotExist
	}
	if errors.Is(err, fs.ErrNotExist) {
		if err := createKey(dir, path); err != nil {
			return nil, err
		}
		return loadKey(dir)
	} else if err != nil {
		return nil, fmt.Errorf("read secret key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secret key %s: want 32 bytes, have %d", path, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("secret key: %w", err)
	}
	return &sealer{aead: aead}, nil
}

// createKey writes a new key to path unless one appears there first
// (another process won the race: its key is the one).
func createKey(dir, path string) error {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("secret key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("secret key: %w", err)
	}
	if _, err := atomicfile.Create(path, key, 0o600); err != nil {
		return fmt.Errorf("create secret key: %w", err)
	}
	return nil
}

// seal returns a copy of a stored document with every secret value
// encrypted.
func (s *sealer) seal(doc map[string]any) (map[string]any, error) {
	out := configschema.Clone(doc)
	var first error
	configschema.Walk(doc, func(path string, p *configschema.Property, v any) {
		if p == nil || !p.Secret || first != nil {
			return
		}
		plain, err := json.Marshal(v)
		if err != nil {
			first = err
			return
		}
		nonce := make([]byte, s.aead.NonceSize())
		if _, err := rand.Read(nonce); err != nil {
			first = err
			return
		}
		ct := s.aead.Seal(nonce, nonce, plain, []byte(path))
		_ = configschema.Set(out, path, encPrefix+base64.RawStdEncoding.EncodeToString(ct))
	})
	return out, first
}

// open is seal's inverse.
func (s *sealer) open(doc map[string]any) (map[string]any, error) {
	out := configschema.Clone(doc)
	var first error
	configschema.Walk(doc, func(path string, p *configschema.Property, v any) {
		if p == nil || !p.Secret || first != nil {
			return
		}
		str, ok := v.(string)
		if !ok || !strings.HasPrefix(str, encPrefix) {
			first = fmt.Errorf("stored secret `%s` is not encrypted", path)
			return
		}
		ct, err := base64.RawStdEncoding.DecodeString(str[len(encPrefix):])
		if err != nil || len(ct) < s.aead.NonceSize() {
			first = fmt.Errorf("stored secret `%s` is malformed", path)
			return
		}
		plain, err := s.aead.Open(nil, ct[:s.aead.NonceSize()], ct[s.aead.NonceSize():], []byte(path))
		if err != nil {
			first = fmt.Errorf("%w: stored secret `%s` does not open with %s: %w", ErrKeyMismatch, path, KeyFileName, err)
			return
		}
		var val any
		if err := json.Unmarshal(plain, &val); err != nil {
			first = fmt.Errorf("stored secret `%s`: %w", path, err)
			return
		}
		_ = configschema.Set(out, path, val)
	})
	return out, first
}
