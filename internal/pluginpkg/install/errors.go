package install

import "errors"

// Sentinel errors; returned errors wrap one of them (or a manifest error).
var (
	// ErrArchive: the archive is unsafe or malformed (traversal, absolute
	// or drive-letter paths, links, too many manifests, too large).
	ErrArchive = errors.New("install: archive refused")
	// ErrTooLarge: a download or an extraction passed its cap.
	ErrTooLarge = errors.New("install: size limit exceeded")
	// ErrDigest: the archive does not match the index's sha256.
	ErrDigest = errors.New("install: digest mismatch")
	// ErrRegistry: the registry index is unreachable or malformed, or has
	// no matching entry.
	ErrRegistry = errors.New("install: registry")
	// ErrNotInstalled: no installed plugin of that name.
	ErrNotInstalled = errors.New("install: not installed")
	// ErrConflict: another folder already holds a plugin of that name.
	ErrConflict = errors.New("install: conflict")
)
