package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// DefaultRegistryURL is seed 003's default registry index.
const DefaultRegistryURL = "https://raw.githubusercontent.com/zeroclaw-labs/zeroclaw-plugins/main/registry.json"

// RegistryEnv overrides DefaultRegistryURL; a --registry flag overrides it.
const RegistryEnv = "ZEROCLAW_PLUGIN_REGISTRY_URL"

// RegistryURL picks the index URL: flag, then RegistryEnv, then the
// default.
func RegistryURL(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv(RegistryEnv); env != "" {
		return env
	}
	return DefaultRegistryURL
}

// Index is a registry index (docs/spec.md §8): JSON with English keys.
type Index struct {
	Plugins []Entry `json:"plugins"`
	// base is where the index was read from, for relative entry URLs.
	base *url.URL
}

// Entry is one published version of a plugin.
type Entry struct {
	Name         string   `json:"name"`
	Version      string   `json:"version"`
	Description  string   `json:"description"`
	Author       string   `json:"author"`
	Capabilities []string `json:"capabilities"`
	// URL is the zip archive: https, http, file://, or a path relative to
	// the index.
	URL string `json:"url"`
	// SHA256 is "sha256:<hex>" of the archive, or empty.
	SHA256 string `json:"sha256"`
}

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-fA-F]{64}$`)

// Client reads indexes and archives.
type Client struct {
	HTTP   *http.Client
	Limits Limits
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 5 * time.Minute}
}

// FetchIndex reads and validates the index at rawURL (http, https, file://
// or a local path), at most Limits.IndexBytes.
func (c *Client) FetchIndex(ctx context.Context, rawURL string) (*Index, error) {
	u, err := parseLocation(rawURL)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := c.fetch(ctx, u, &buf, c.Limits.withDefaults().IndexBytes); err != nil {
		return nil, fmt.Errorf("%w: index %s: %w", ErrRegistry, rawURL, err)
	}
	dec := json.NewDecoder(&buf)
	var idx Index
	if err := dec.Decode(&idx); err != nil {
		return nil, fmt.Errorf("%w: index %s is not valid JSON: %w", ErrRegistry, rawURL, err)
	}
	for i, e := range idx.Plugins {
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("%w: index %s: plugins[%d]: %w", ErrRegistry, rawURL, i, err)
		}
	}
	idx.base = u
	return &idx, nil
}

func (e Entry) validate() error {
	if !manifest.NamePattern.MatchString(e.Name) {
		return fmt.Errorf("name %q is not a plugin name", e.Name)
	}
	if _, err := semver.StrictNewVersion(e.Version); err != nil {
		return fmt.Errorf("version %q: %w", e.Version, err)
	}
	if e.URL == "" {
		return fmt.Errorf("url is empty")
	}
	if e.SHA256 != "" && !digestPattern.MatchString(e.SHA256) {
		return fmt.Errorf("sha256 %q must be sha256:<64 hex digits>", e.SHA256)
	}
	return nil
}

// Search returns the entries whose name or description contains query,
// case-insensitively; an empty query matches everything. It only reads
// the index: nothing is installed or run.
func (idx *Index) Search(query string) []Entry {
	q := strings.ToLower(query)
	var out []Entry
	for _, e := range idx.Plugins {
		if strings.Contains(strings.ToLower(e.Name), q) || strings.Contains(strings.ToLower(e.Description), q) {
			out = append(out, e)
		}
	}
	return out
}

// ParseRef splits NAME[@VERSION].
func ParseRef(ref string) (name, version string, err error) {
	name, version, _ = strings.Cut(ref, "@")
	if !manifest.NamePattern.MatchString(name) {
		return "", "", fmt.Errorf("%w: %q is not a plugin name", ErrRegistry, name)
	}
	if version != "" {
		if _, err := semver.StrictNewVersion(version); err != nil {
			return "", "", fmt.Errorf("%w: version %q: %w", ErrRegistry, version, err)
		}
	}
	return name, version, nil
}

// Resolve picks the entry for name: the one with that exact version when
// version is set, else the last entry of that name in the index (seed
// 003: publishers order repeated names on purpose).
func (idx *Index) Resolve(name, version string) (Entry, error) {
	var want *semver.Version
	if version != "" {
		v, err := semver.StrictNewVersion(version)
		if err != nil {
			return Entry{}, fmt.Errorf("%w: version %q: %w", ErrRegistry, version, err)
		}
		want = v
	}
	found := -1
	for i, e := range idx.Plugins {
		if e.Name != name {
			continue
		}
		if want != nil {
			if v, err := semver.StrictNewVersion(e.Version); err != nil || !v.Equal(want) {
				continue
			}
		}
		found = i
	}
	if found < 0 {
		if version != "" {
			return Entry{}, fmt.Errorf("%w: no %s@%s in the index", ErrRegistry, name, version)
		}
		return Entry{}, fmt.Errorf("%w: no %s in the index", ErrRegistry, name)
	}
	return idx.Plugins[found], nil
}

// ArchiveURL resolves an entry's url against the index's location. An
// index read over the network may not point at local files.
func (idx *Index) ArchiveURL(e Entry) (*url.URL, error) {
	ref, err := url.Parse(e.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: url %q: %w", ErrRegistry, e.URL, err)
	}
	u := ref
	if idx.base != nil {
		u = idx.base.ResolveReference(ref)
	}
	switch u.Scheme {
	case "http", "https":
	case "file":
		if idx.base != nil && idx.base.Scheme != "file" {
			return nil, fmt.Errorf("%w: url %q: an index read over the network may not name local files", ErrRegistry, e.URL)
		}
	default:
		return nil, fmt.Errorf("%w: url %q: unsupported scheme", ErrRegistry, e.URL)
	}
	return u, nil
}

// Download streams the entry's archive into w, at most
// Limits.DownloadBytes whatever the server says (no Content-Length is
// needed to stay bounded), and checks its sha256 when the entry has one.
func (c *Client) Download(ctx context.Context, idx *Index, e Entry, w io.Writer) error {
	u, err := idx.ArchiveURL(e)
	if err != nil {
		return err
	}
	h := sha256.New()
	if err := c.fetch(ctx, u, io.MultiWriter(w, h), c.Limits.withDefaults().DownloadBytes); err != nil {
		return err
	}
	if e.SHA256 != "" {
		got := "sha256:" + hex.EncodeToString(h.Sum(nil))
		if !strings.EqualFold(got, e.SHA256) {
			return fmt.Errorf("%w: %s@%s is %s, the index says %s", ErrDigest, e.Name, e.Version, got, e.SHA256)
		}
	}
	return nil
}

// fetch copies at most limit bytes of u into w; more is ErrTooLarge.
func (c *Client) fetch(ctx context.Context, u *url.URL, w io.Writer, limit int64) error {
	var body io.ReadCloser
	switch u.Scheme {
	case "file":
		f, err := os.Open(filepath.FromSlash(u.Path))
		if err != nil {
			return err
		}
		body = f
	case "http", "https":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		resp, err := c.httpClient().Do(req)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return fmt.Errorf("%s answered %s", u.Redacted(), resp.Status)
		}
		if resp.ContentLength > limit {
			resp.Body.Close()
			return fmt.Errorf("%w: %s is %d bytes; the limit is %d", ErrTooLarge, u.Redacted(), resp.ContentLength, limit)
		}
		body = resp.Body
	default:
		return fmt.Errorf("unsupported scheme %q", u.Scheme)
	}
	defer body.Close()
	n, err := io.Copy(w, io.LimitReader(body, limit+1))
	if n > limit {
		return fmt.Errorf("%w: %s passed %d bytes", ErrTooLarge, u.Redacted(), limit)
	}
	return err
}

// parseLocation reads an index location: a URL, or a local path.
func parseLocation(raw string) (*url.URL, error) {
	if !strings.Contains(raw, "://") {
		abs, err := filepath.Abs(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRegistry, err)
		}
		return &url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrRegistry, raw, err)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("%w: %q has no host", ErrRegistry, raw)
		}
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("%w: %q: a file URL names no host", ErrRegistry, raw)
		}
	default:
		return nil, fmt.Errorf("%w: %q: unsupported scheme", ErrRegistry, raw)
	}
	return u, nil
}
