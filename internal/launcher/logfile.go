package launcher

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Each process's log (<data>/logs/<name>.log) is kept under a bound: the
// launcher hands every run of a process one end of a pipe for its stdout
// and stderr and copies what comes out of the other into the file
// (copyLog). Once the file holds maxLogBytes, the line under way is
// finished in it, the file becomes <name>.log.old (replacing the one
// before) and a new one begins, so a process that runs for months or
// restarts in a loop keeps at most about twice the bound on disk.
// Appended to directly, as the children's logs were, they grew for good.
//
// A process whose launcher is gone gets EPIPE (or SIGPIPE) on its next
// log line; it is being stopped then already (Pdeathsig).

// maxLogBytes is the size at which a process's log is rotated.
const maxLogBytes = 8 << 20

// logDrainGrace bounds how long an exited run's output is still copied.
const logDrainGrace = 2 * time.Second

// logFile is one process's log, shared by its runs (an exited run's last
// lines may still be copied while the next run writes).
type logFile struct {
	path string
	max  int64

	mu        sync.Mutex
	f         *os.File
	size      int64
	lineStart bool  // the last write ended a line
	lineAt    int64 // where the line under way began in the file
	// dropping is set while the rest of a line a failed write cut is
	// dropped: the stream's bytes up to its next line end.
	dropping bool
	// checked is when the file at the path was last compared with f;
	// reopenEvery is how often it is (reopenIfGone).
	checked     time.Time
	reopenEvery time.Duration
}

// logReopenEvery is how often a log's writes look whether its file is
// still at its path: a stat, at most once a second.
const logReopenEvery = time.Second

// openLog opens path for appending, creating it.
func openLog(path string, max int64) (*logFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &logFile{path: path, max: max, f: f, size: fi.Size(), lineStart: true, lineAt: fi.Size(),
		checked: time.Now(), reopenEvery: logReopenEvery}, nil
}

// reopenIfGone opens the log at its path again when the file there is no
// longer the one written: removed (by hand, to free space, or with its
// folder) or replaced. Before, the lines went on into a file nobody could
// read, which kept its space until the next rotation (up to maxLogBytes,
// for each process), and the log was back only when the launcher
// restarted. A file that cannot be opened again is tried at the next
// check.
func (l *logFile) reopenIfGone() {
	var at, held syscall.Stat_t
	err := syscall.Stat(l.path, &at)
	if err == nil {
		if syscall.Fstat(int(l.f.Fd()), &held) != nil || at.Dev == held.Dev && at.Ino == held.Ino {
			return
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err := os.MkdirAll(filepath.Dir(l.path), 0o700); err != nil {
		return
	}
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return
	}
	l.f.Close()
	l.f, l.size, l.lineAt = f, fi.Size(), fi.Size()
}

// Write appends p. The line that crosses the bound is finished in the
// file, which is then rotated where the next line starts (a pipe's reads
// end anywhere in a line); a line that never ends is cut once the file
// holds twice the bound.
//
// A write that fails (a full disk) drops the rest of p, and the line it
// cut is taken out of the file again, the rest of it dropped from what
// comes next: before, the head of the cut line stayed and the next line
// went on from it, two JSON records run together into one that no
// reader of the log could parse.
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	written := 0
	// At a line start, so that no line is split between two files.
	if now := time.Now(); l.lineStart && now.Sub(l.checked) >= l.reopenEvery {
		l.checked = now
		l.reopenIfGone()
	}
	if l.dropping {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.dropping = false
		written, p = i+1, p[i+1:]
	}
	endsLine := len(p) > 0 && p[len(p)-1] == '\n'
	for len(p) > 0 {
		if l.size >= 2*l.max || l.size >= l.max && l.lineStart {
			if err := l.rotate(); err != nil {
				return written, err
			}
		}
		cut := len(p)
		if room := l.max - l.size; int64(len(p)) > room {
			from := max(room-1, 0)
			if i := bytes.IndexByte(p[from:], '\n'); i >= 0 {
				cut = int(from) + i + 1
			}
		}
		n, err := l.write(p[:cut])
		written += n
		if err != nil {
			return written, l.cutLine(err, endsLine)
		}
		p = p[cut:]
	}
	return written, nil
}

func (l *logFile) write(p []byte) (int, error) {
	n, err := l.f.Write(p)
	if i := bytes.LastIndexByte(p[:n], '\n'); i >= 0 {
		l.lineAt = l.size + int64(i) + 1
	}
	l.size += int64(n)
	if n > 0 {
		l.lineStart = p[n-1] == '\n'
	}
	return n, err
}

// cutLine follows a write that failed with err: the line it cut is
// truncated off the file, and, unless the bytes the caller gave ended a
// line (endsLine), the rest of that line is dropped from the next
// writes. Where the truncation fails too the head of the line stays.
func (l *logFile) cutLine(err error, endsLine bool) error {
	l.dropping = !endsLine
	if l.lineStart {
		return err
	}
	if terr := l.f.Truncate(l.lineAt); terr != nil {
		return errors.Join(err, terr)
	}
	l.size, l.lineStart = l.lineAt, true
	return err
}

// rotate moves the file to path.old and begins a new one. Where the rename
// fails the file is emptied instead: the bound holds, the old lines go.
func (l *logFile) rotate() error {
	renamed := os.Rename(l.path, l.path+".old")
	if renamed != nil {
		if err := l.f.Truncate(0); err != nil {
			return errors.Join(renamed, err)
		}
		l.size, l.lineAt = 0, 0
		return nil
	}
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return err // l.f, now path.old, takes the lines meanwhile
	}
	l.f.Close()
	l.f, l.size, l.lineAt = f, 0, 0
	return nil
}

// Close closes the file; later writes fail.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// copyLog copies a run's output from r into l until r ends (every holder
// of the pipe's other end has exited) or is closed. A write that fails
// drops what it held: the process must never block on its log. The first
// failure of the run is told to failed (a full disk would otherwise lose
// the lines unsaid).
// watch (nil: none) looks at every chunk copied (upgraded.go).
func copyLog(r *os.File, l *logFile, failed func(error), watch *upgradeWatch) {
	buf := make([]byte, 32<<10)
	told := false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			watch.write(buf[:n])
			if _, werr := l.Write(buf[:n]); werr != nil && !told {
				failed(werr)
				told = true
			}
		}
		if err != nil {
			return
		}
	}
}
