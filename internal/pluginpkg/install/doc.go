// Package install puts plugins into the plugins directory: from a local
// directory (or its manifest.toml) or from a registry's JSON index and zip
// archive, under the signature policy, and removes them.
//
// The plugins directory is shared by every sandbox replica, each of which
// rescans it (see pluginsandbox's discovery), so a plugin must never be
// seen half-written: everything is staged in a hidden folder inside the
// plugins directory (".install-*", which discovery skips) and renamed into
// place; replacing an installed plugin swaps the two folders atomically
// where the kernel supports it (Linux renameat2 RENAME_EXCHANGE).
// Installs and removals of one plugins directory are serialised by a lock
// file.
package install
