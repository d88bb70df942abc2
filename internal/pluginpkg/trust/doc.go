// Package trust checks that plugin files can be changed by nobody but the
// stack's own user and root: a plugin runs with the grants its manifest
// asks for, so whoever can write its folder chooses them. The plugin
// sandbox refuses what fails before loading it; clawmesh doctor says so.
package trust

import "errors"

// MaxEntries bounds the files and folders a plugin folder may hold, as an
// install's copy is bounded: the check reads each one.
const MaxEntries = 10000

// ErrUntrusted marks a plugin folder, or the plugins folder, that someone
// other than the stack's own user (or root) could change.
var ErrUntrusted = errors.New("untrusted plugin files")
