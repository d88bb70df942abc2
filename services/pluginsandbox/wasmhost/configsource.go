package wasmhost

import (
	"context"
	"errors"
	"sync"
)

// ConfigRevision is one revision of a plugin instance's operator values:
// strings, as stored under plugins.entries.<instance-key>.config.
type ConfigRevision struct {
	Revision string
	Values   map[string]string
	// Denied lists secret properties that exist but that the caller may not
	// read: secrets_get answers access-denied for them, not not-found.
	Denied []string
}

// ConfigSource resolves a plugin instance's config. The host calls Resolve
// at most once per call frame, so every config and secret read within one
// call sees one canonical revision; the materialised view is dropped when
// the frame ends. Resolve must honour ctx.
type ConfigSource interface {
	Resolve(ctx context.Context, instanceKey string) (ConfigRevision, error)
}

// ErrNoConfig may be returned by a ConfigSource for an instance with no
// stored values; the host then materialises an empty object.
var ErrNoConfig = errors.New("wasmhost: no config stored")

// MemoryConfig is an in-memory ConfigSource, for tests and for a sandbox run
// without the config service. It is safe for concurrent use.
type MemoryConfig struct {
	mu      sync.Mutex
	rev     int
	entries map[string]map[string]string
	// Fail, when set, is returned by Resolve (to simulate an outage).
	Fail error
}

// Set replaces the values of one instance key and bumps the revision.
func (m *MemoryConfig) Set(instanceKey string, values map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries == nil {
		m.entries = map[string]map[string]string{}
	}
	cp := make(map[string]string, len(values))
	for k, v := range values {
		cp[k] = v
	}
	m.entries[instanceKey] = cp
	m.rev++
}

// Resolve implements ConfigSource.
func (m *MemoryConfig) Resolve(ctx context.Context, instanceKey string) (ConfigRevision, error) {
	if err := ctx.Err(); err != nil {
		return ConfigRevision{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Fail != nil {
		return ConfigRevision{}, m.Fail
	}
	vals, ok := m.entries[instanceKey]
	if !ok {
		return ConfigRevision{}, ErrNoConfig
	}
	cp := make(map[string]string, len(vals))
	for k, v := range vals {
		cp[k] = v
	}
	return ConfigRevision{Revision: itoa(m.rev), Values: cp}, nil
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
