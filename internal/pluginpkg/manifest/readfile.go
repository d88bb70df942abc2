package manifest

import (
	"fmt"
	"io"
	"os"
)

// readRegular opens name with open and reads it whole. The callers check
// a file with Lstat first, for their own messages; the check is repeated
// on what was opened, since the file may be swapped in between: opened
// without waiting (oNonBlock), a FIFO or device put there is refused
// instead of holding a scan for good, and the bytes are counted as read,
// whatever size the file claimed.
func readRegular(name string, limit int64, open func(name string, flag int) (*os.File, error)) ([]byte, error) {
	f, err := open(name, os.O_RDONLY|oNonBlock)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrLayout, name)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrLayout, name, limit)
	}
	return data, nil
}

// openNoFollow opens a path outside an os.Root without following a link
// in its last element.
func openNoFollow(name string, flag int) (*os.File, error) {
	return os.OpenFile(name, flag|oNoFollow, 0)
}
