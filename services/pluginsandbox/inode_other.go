//go:build !unix

package pluginsandbox

import "os"

// inode is empty where the platform has none; size and times remain.
func inode(os.FileInfo) string { return "" }

// openDirFlags: elsewhere Lstat has refused links and there are no FIFOs.
const openDirFlags = 0
