//go:build unix

package pluginsandbox

import (
	"os"
	"strconv"
	"syscall"
)

// inode identifies a file across renames: a reinstalled plugin is a new
// folder even when its size and times match the old one's.
func inode(fi os.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return strconv.FormatUint(uint64(st.Dev), 10) + "/" + strconv.FormatUint(uint64(st.Ino), 10)
	}
	return ""
}

// openDirFlags open a folder without following a link or waiting on a
// FIFO put in its place.
const openDirFlags = syscall.O_DIRECTORY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK
