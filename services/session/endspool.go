package session

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/ids"
)

// endSpool keeps on the local disk the ends of turns whose write failed
// (turnEnd), one file a turn, <DataDir>/unended/<turn_id>.end, written
// and synced before the turn's turn_complete is published and removed
// once the end is in the store. Kept in memory only, they died with the
// process: the next start found the turn running and recorded it as
// recovery records one (cancelled, interrupted, its last chunks missing)
// and published a second turn_complete, though its clients had been told
// it ended otherwise. The next start writes what it finds here before
// recovery, so recovery finds the turn ended and publishes nothing.
//
// The database that refused the end is the one thing that cannot hold
// it; the local disk is the service's own (its workspaces live there).
// A file is trusted only as far as it checks: its format and version,
// a digest of its body, ids of the right form naming the file's own turn,
// and, when written, a turn still running in the session the file names.
type endSpool struct {
	dir string
	log *zap.Logger

	// mu guards sizes and total: what the files on disk hold, within
	// maxSpooledEnds and maxSpooledBytes.
	mu    sync.Mutex
	sizes map[string]int64
	total int64
}

const (
	// spoolFormat and spoolVersion head every file: another program's
	// file, or one of a later format, is refused rather than guessed at.
	spoolFormat  = "clawmesh.session.turn-end"
	spoolVersion = 1
	spoolExt     = ".end"
	// refusedExt is added to a file the start refused: kept for a person
	// to read, never read again.
	refusedExt = ".refused"

	// maxSpooledEnds and maxSpooledBytes bound the spool: a session holds
	// at most one end not written (its next admission writes it first or
	// is refused), so the count is that of the sessions whose end failed
	// at once; the bytes are four times what memory keeps.
	maxSpooledEnds  = 1024
	maxSpooledBytes = 4 * maxUnendedBytes
	// maxSpooledFile bounds one file as read back: a reply and its text
	// (MaxReplyBytes each) and the events of a turn, JSON-escaped.
	maxSpooledFile = 64 << 20
)

// errSpoolFull is put's answer past maxSpooledEnds or maxSpooledBytes.
var errSpoolFull = errors.New("the spool of turn ends is full")

// spoolHeader is a file's first line.
type spoolHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// SHA256 is the hex digest of the body, the rest of the file.
	SHA256 string `json:"sha256"`
}

// spooledEnd is a turnEnd as a file's body holds it.
type spooledEnd struct {
	SessionID  string    `json:"session_id"`
	TurnID     string    `json:"turn_id"`
	Outcome    string    `json:"outcome"`
	StopReason string    `json:"stop_reason"`
	Content    string    `json:"content"`
	Error      string    `json:"error,omitempty"`
	Said       string    `json:"said,omitempty"`
	Unshown    string    `json:"unshown,omitempty"`
	Published  *int64    `json:"published,omitempty"`
	Unrecorded []string  `json:"unrecorded,omitempty"`
	UpdateMap  []int64   `json:"update_map"`
	Events     []cpEvent `json:"events,omitempty"`
}

// openEndSpool opens (making it) the spool in dir and returns the ends it
// holds, for the start to write. A file that does not check is renamed
// aside (refusedExt) with a log saying why; what a write cut by a crash
// left (atomicfile's temporary files) is removed.
func openEndSpool(dir string, log *zap.Logger) (*endSpool, []*turnEnd, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("turn end spool: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("turn end spool: %w", err)
	}
	sp := &endSpool{dir: dir, log: log, sizes: map[string]int64{}}
	var ends []*turnEnd
	for _, de := range entries {
		name := de.Name()
		path := filepath.Join(dir, name)
		switch {
		case strings.HasPrefix(name, "."):
			_ = os.Remove(path)
			continue
		case strings.HasSuffix(name, refusedExt):
			log.Warn("turn end spool: a file refused by an earlier start is still there", zap.String("path", path))
			continue
		}
		e, size, err := sp.read(name)
		if err != nil {
			log.Error("turn end spool: file refused, its turn is left to recovery", zap.String("path", path), zap.Error(err))
			if err := os.Rename(path, path+refusedExt); err != nil {
				return nil, nil, fmt.Errorf("turn end spool: set %s aside: %w", path, err)
			}
			continue
		}
		if len(sp.sizes) >= maxSpooledEnds || sp.total+size > maxSpooledBytes {
			// Not this build's bounds, so not ours: read, not trusted to
			// fit.
			log.Error("turn end spool: file past the spool's bounds, its turn is left to recovery", zap.String("path", path))
			if err := os.Rename(path, path+refusedExt); err != nil {
				return nil, nil, fmt.Errorf("turn end spool: set %s aside: %w", path, err)
			}
			continue
		}
		sp.sizes[e.turnID] = size
		sp.total += size
		ends = append(ends, e)
	}
	return sp, ends, nil
}

func (sp *endSpool) path(turnID string) string { return filepath.Join(sp.dir, turnID+spoolExt) }

// put writes e's file, synced, within the spool's bounds.
func (sp *endSpool) put(e *turnEnd) error {
	if !ids.Token(e.turnID) || !ids.Token(e.sessionID) {
		return fmt.Errorf("spool turn %q's end: ids not of their form", e.turnID)
	}
	body, err := json.Marshal(spooledEnd{
		SessionID: e.sessionID, TurnID: e.turnID, Outcome: e.res.Outcome, StopReason: e.res.StopReason,
		Content: e.res.Content, Error: e.res.Error, Said: e.res.Said, Unshown: e.said, Published: e.published,
		Unrecorded: e.unrecorded, UpdateMap: e.updateMap, Events: e.events,
	})
	if err != nil {
		return fmt.Errorf("spool turn %s's end: %w", e.turnID, err)
	}
	sum := sha256.Sum256(body)
	head, err := json.Marshal(spoolHeader{Format: spoolFormat, Version: spoolVersion, SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return fmt.Errorf("spool turn %s's end: %w", e.turnID, err)
	}
	data := make([]byte, 0, len(head)+1+len(body))
	data = append(append(append(data, head...), '\n'), body...)
	size := int64(len(data))

	sp.mu.Lock()
	defer sp.mu.Unlock()
	if _, ok := sp.sizes[e.turnID]; ok {
		return fmt.Errorf("spool turn %s's end: already spooled", e.turnID)
	}
	if size > maxSpooledFile || len(sp.sizes) >= maxSpooledEnds || sp.total+size > maxSpooledBytes {
		return fmt.Errorf("spool turn %s's end (%d bytes): %w", e.turnID, size, errSpoolFull)
	}
	// Under mu: the bound counts a file once it is there; the write is
	// the failure path's alone, so nothing waits on it but other failed
	// ends.
	if err := atomicfile.Replace(sp.path(e.turnID), data, 0o600); err != nil {
		return fmt.Errorf("spool turn %s's end: %w", e.turnID, err)
	}
	sp.sizes[e.turnID] = size
	sp.total += size
	return nil
}

// load reads the end of turn turnID back.
func (sp *endSpool) load(turnID string) (*turnEnd, error) {
	e, _, err := sp.read(turnID + spoolExt)
	return e, err
}

// remove removes turnID's file, its end written (or its session
// deleted). A file that cannot be removed is written again, to no
// effect, by the next start: its turn is not running any more.
func (sp *endSpool) remove(turnID string) {
	sp.mu.Lock()
	size, ok := sp.sizes[turnID]
	delete(sp.sizes, turnID)
	sp.total -= size
	sp.mu.Unlock()
	if !ok {
		return
	}
	if err := os.Remove(sp.path(turnID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		sp.log.Warn("turn end spool: remove a written end", zap.String("turn_id", turnID), zap.Error(err))
	}
}

// bytes is what the spool's files hold.
func (sp *endSpool) bytes() int64 {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.total
}

// read reads and checks the file name of the spool.
func (sp *endSpool) read(name string) (*turnEnd, int64, error) {
	turnID, ok := strings.CutSuffix(name, spoolExt)
	if !ok || !ids.Token(turnID) {
		return nil, 0, fmt.Errorf("%q is not named <turn id>%s", name, spoolExt)
	}
	// Not through a link, and without waiting on a FIFO's writer: a start
	// that opened one here blocked before serving anything.
	f, err := os.OpenFile(filepath.Join(sp.dir, name), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() || st.Size() > maxSpooledFile {
		return nil, 0, fmt.Errorf("not a regular file of at most %d bytes", maxSpooledFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSpooledFile+1))
	if err != nil {
		return nil, 0, err
	}
	e, err := decodeSpooled(data, turnID)
	return e, int64(len(data)), err
}

// decodeSpooled checks and decodes a file's data, the end of turn turnID.
func decodeSpooled(data []byte, turnID string) (*turnEnd, error) {
	line, body, ok := bytes.Cut(data, []byte{'\n'})
	if !ok {
		return nil, errors.New("no header line")
	}
	var h spoolHeader
	if err := json.Unmarshal(line, &h); err != nil || h.Format != spoolFormat {
		return nil, fmt.Errorf("not a turn end of this service (format %q, want %q)", h.Format, spoolFormat)
	}
	if h.Version != spoolVersion {
		return nil, fmt.Errorf("format version %d, this build reads %d", h.Version, spoolVersion)
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != h.SHA256 {
		return nil, errors.New("corrupt: its body's digest differs from its header's")
	}
	var s spooledEnd
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	switch {
	case s.TurnID != turnID:
		return nil, fmt.Errorf("holds turn %q, named %q", s.TurnID, turnID)
	case !ids.Token(s.SessionID):
		return nil, errors.New("session id not of its form")
	case s.Outcome != OutcomeCompleted && s.Outcome != OutcomeCancelled && s.Outcome != OutcomeFailed:
		return nil, fmt.Errorf("outcome %q", s.Outcome)
	}
	for _, id := range s.Unrecorded {
		if !ids.Token(id) {
			return nil, errors.New("an approval's id not of its form")
		}
	}
	for _, ev := range s.Events {
		if ev.SessionID != s.SessionID || ev.TurnID != s.TurnID {
			return nil, fmt.Errorf("an event of turn %q of session %q", ev.TurnID, ev.SessionID)
		}
		switch ev.Kind {
		case eventUser, eventText, eventThought, eventToolCall, eventToolResult:
		default:
			return nil, fmt.Errorf("an event of kind %q", ev.Kind)
		}
	}
	return &turnEnd{
		sessionID: s.SessionID, turnID: s.TurnID,
		res:  turnResult{Outcome: s.Outcome, StopReason: s.StopReason, Content: s.Content, Error: s.Error, Said: s.Said},
		said: s.Unshown, published: s.Published, unrecorded: s.Unrecorded, updateMap: s.UpdateMap, mapped: true,
		events: s.Events,
	}, nil
}
