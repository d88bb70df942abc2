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
	"slices"
	"strings"
	"sync"
	"time"

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
	// Version 1 (the sixty-sixth round's) held each text as a JSON string
	// where it occurs, the reply three times over (the reply, the text
	// the transcript lacks, the events); it is still read (spooledEndV1):
	// such a file is the end of a turn whose clients were told it ended,
	// and refused, its turn would be recorded as recovery records one and
	// a second turn_complete published. It is never written.
	spoolFormat  = "clawmesh.session.turn-end"
	spoolVersion = 2
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
	// maxSpooledFile bounds one file as read back: a reply (MaxReplyBytes),
	// the prompt and the turn's other events.
	maxSpooledFile = 64 << 20

	// maxRefusedFiles, maxRefusedBytes and maxRefusedAge bound the files
	// set aside as refused: each start removes those refused longer ago
	// than the age, then the oldest past the count or the bytes, with a
	// log of each. A person has the age to read one; a spool that refuses
	// a file at every start does not grow without end.
	maxRefusedFiles = 16
	maxRefusedBytes = maxSpooledBytes
	maxRefusedAge   = 7 * 24 * time.Hour
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

// A file of version 2 is the header line, then the body: a line of JSON
// (spooledEnd) and the end's text, raw, text_bytes of it. Each string of
// the end is a span of that text: the reply once, the text the
// transcript lacks (its tail) and the turn's streamed text events
// (slices of it, in order) pointing into it, so that a 4 MiB reply is a
// file of about 4 MiB, not three copies JSON-escaped (up to six bytes a
// character), and its bytes come back exactly as they were sent.

// span is [offset, length] in a file's text.
type span [2]int64

// spooledEnd is a turnEnd as a file's body holds it.
type spooledEnd struct {
	SessionID  string         `json:"session_id"`
	TurnID     string         `json:"turn_id"`
	Outcome    string         `json:"outcome"`
	StopReason string         `json:"stop_reason"`
	Content    span           `json:"content"`
	Error      span           `json:"error"`
	Said       span           `json:"said"`
	Unshown    span           `json:"unshown"`
	Published  *int64         `json:"published,omitempty"`
	Unrecorded []string       `json:"unrecorded,omitempty"`
	UpdateMap  []int64        `json:"update_map"`
	Events     []spooledEvent `json:"events,omitempty"`
	TextBytes  int64          `json:"text_bytes"`
}

// spooledEvent is a cpEvent of the end's turn.
type spooledEvent struct {
	Seq        int64     `json:"seq"`
	Step       int       `json:"step"`
	Kind       string    `json:"kind"`
	Surface    string    `json:"surface,omitempty"`
	Content    span      `json:"content"`
	CallID     string    `json:"call_id,omitempty"`
	ToolCallID string    `json:"tool_call_id,omitempty"`
	Name       string    `json:"name,omitempty"`
	At         time.Time `json:"at"`
	Marks      []byte    `json:"marks,omitempty"`
}

// spooledEndV1 is the body of a file of version 1.
type spooledEndV1 struct {
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
	var refused []refusedFile
	now := time.Now()
	refuse := func(path string) error {
		if err := os.Rename(path, path+refusedExt); err != nil {
			return fmt.Errorf("turn end spool: set %s aside: %w", path, err)
		}
		// Its age is counted from its refusal, not from its writing; a
		// link's own time, not that of the file it names.
		ts := unix.NsecToTimespec(now.UnixNano())
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, path+refusedExt, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			log.Warn("turn end spool: date a refused file", zap.String("path", path+refusedExt), zap.Error(err))
		}
		var size int64
		if st, err := os.Lstat(path + refusedExt); err == nil {
			size = st.Size()
		}
		refused = append(refused, refusedFile{path: path + refusedExt, at: now, size: size})
		return nil
	}
	for _, de := range entries {
		name := de.Name()
		path := filepath.Join(dir, name)
		switch {
		case strings.HasPrefix(name, "."):
			_ = os.Remove(path)
			continue
		case strings.HasSuffix(name, refusedExt):
			if st, err := de.Info(); err == nil {
				refused = append(refused, refusedFile{path: path, at: st.ModTime(), size: st.Size()})
			}
			continue
		}
		e, size, err := sp.read(name)
		if err != nil {
			log.Error("turn end spool: file refused, its turn is left to recovery", zap.String("path", path), zap.Error(err))
			if err := refuse(path); err != nil {
				return nil, nil, err
			}
			continue
		}
		if len(sp.sizes) >= maxSpooledEnds || sp.total+size > maxSpooledBytes {
			// Not this build's bounds, so not ours: read, not trusted to
			// fit.
			log.Error("turn end spool: file past the spool's bounds, its turn is left to recovery", zap.String("path", path))
			if err := refuse(path); err != nil {
				return nil, nil, err
			}
			continue
		}
		sp.sizes[e.turnID] = size
		sp.total += size
		ends = append(ends, e)
	}
	pruneRefused(refused, now, log)
	return sp, ends, nil
}

// refusedFile is a file set aside as refused, refused at (its mtime).
type refusedFile struct {
	path string
	at   time.Time
	size int64
}

// pruneRefused removes the refused files older than maxRefusedAge, then,
// newest first, those past maxRefusedFiles or maxRefusedBytes, logging
// each; the rest are kept, named in one line, not one a file.
func pruneRefused(refused []refusedFile, now time.Time, log *zap.Logger) {
	slices.SortFunc(refused, func(a, b refusedFile) int { return b.at.Compare(a.at) })
	kept, held := 0, int64(0)
	for _, f := range refused {
		var why string
		switch {
		case now.Sub(f.at) > maxRefusedAge:
			why = fmt.Sprintf("refused more than %d days ago", int(maxRefusedAge/(24*time.Hour)))
		case kept >= maxRefusedFiles:
			why = fmt.Sprintf("past the %d newest refused files kept", maxRefusedFiles)
		case held+f.size > maxRefusedBytes:
			why = fmt.Sprintf("past the %d bytes of refused files kept", maxRefusedBytes)
		default:
			kept++
			held += f.size
			continue
		}
		if err := os.Remove(f.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Warn("turn end spool: remove a refused file", zap.String("path", f.path), zap.Error(err))
			continue
		}
		log.Warn("turn end spool: a refused file removed", zap.String("path", f.path), zap.String("why", why), zap.Time("refused_at", f.at))
	}
	if kept > 0 {
		log.Info("turn end spool: refused files kept for a person to read, each removed after its age", zap.Int("files", kept),
			zap.Int64("bytes", held), zap.Duration("age", maxRefusedAge))
	}
}

func (sp *endSpool) path(turnID string) string { return filepath.Join(sp.dir, turnID+spoolExt) }

// put writes e's file, synced, within the spool's bounds.
func (sp *endSpool) put(e *turnEnd) error {
	if !ids.Token(e.turnID) || !ids.Token(e.sessionID) {
		return fmt.Errorf("spool turn %q's end: ids not of their form", e.turnID)
	}
	data, err := encodeSpooled(e)
	if err != nil {
		return fmt.Errorf("spool turn %s's end: %w", e.turnID, err)
	}
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

// textPlacer builds a file's text: each string once where it is not a
// span of what is there already.
type textPlacer struct{ buf []byte }

func (p *textPlacer) add(text string) span {
	if text == "" {
		return span{}
	}
	off := len(p.buf)
	p.buf = append(p.buf, text...)
	return span{int64(off), int64(len(text))}
}

// at is text as the span of p's text at off, if it is there.
func (p *textPlacer) at(off int64, text string) (span, bool) {
	end := off + int64(len(text))
	if off < 0 || end > int64(len(p.buf)) || string(p.buf[off:end]) != text {
		return span{}, false
	}
	return span{off, int64(len(text))}, true
}

// encodeSpooled is e's file, of spoolVersion.
func encodeSpooled(e *turnEnd) ([]byte, error) {
	var p textPlacer
	p.buf = make([]byte, 0, len(e.res.Content)+len(e.res.Said)+64)
	s := spooledEnd{SessionID: e.sessionID, TurnID: e.turnID, Outcome: e.res.Outcome, StopReason: e.res.StopReason,
		Published: e.published, Unrecorded: e.unrecorded, UpdateMap: e.updateMap, Events: make([]spooledEvent, 0, len(e.events))}
	s.Content = p.add(e.res.Content)
	if e.res.Error == e.res.Content {
		s.Error = s.Content // a failed turn's content is its error
	} else {
		s.Error = p.add(e.res.Error)
	}
	s.Said = p.add(e.res.Said)
	// What the turn streamed: a failed turn's Said, another's reply.
	streamed := s.Content
	if e.res.Outcome == OutcomeFailed {
		streamed = s.Said
	}
	var ok bool
	if s.Unshown, ok = p.at(streamed[0]+streamed[1]-int64(len(e.said)), e.said); !ok {
		s.Unshown = p.add(e.said)
	}
	// The text events carried are the tail of what was streamed, in
	// order (those before went in earlier batches); one that is not where
	// that puts it is written out.
	tail := 0
	for _, ev := range e.events {
		if ev.Kind == eventText {
			tail += len(ev.Content)
		}
	}
	cursor := streamed[0] + streamed[1] - int64(tail)
	if cursor < streamed[0] {
		cursor = -1
	}
	for _, ev := range e.events {
		if ev.SessionID != e.sessionID || ev.TurnID != e.turnID {
			return nil, fmt.Errorf("an event of turn %q of session %q", ev.TurnID, ev.SessionID)
		}
		se := spooledEvent{Seq: ev.Seq, Step: ev.Step, Kind: ev.Kind, Surface: ev.Surface, CallID: ev.CallID,
			ToolCallID: ev.ToolCallID, Name: ev.Name, At: ev.At, Marks: ev.Marks}
		placed := false
		if ev.Kind == eventText && cursor >= 0 {
			se.Content, placed = p.at(cursor, ev.Content)
			cursor += int64(len(ev.Content))
		}
		if !placed {
			se.Content = p.add(ev.Content)
		}
		s.Events = append(s.Events, se)
	}
	s.TextBytes = int64(len(p.buf))
	meta, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(meta)
	h.Write([]byte{'\n'})
	h.Write(p.buf)
	head, err := json.Marshal(spoolHeader{Format: spoolFormat, Version: spoolVersion, SHA256: hex.EncodeToString(h.Sum(nil))})
	if err != nil {
		return nil, err
	}
	data := make([]byte, 0, len(head)+len(meta)+len(p.buf)+2)
	data = append(append(data, head...), '\n')
	data = append(append(data, meta...), '\n')
	return append(data, p.buf...), nil
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
	if h.Version != spoolVersion && h.Version != 1 {
		return nil, fmt.Errorf("format version %d, this build reads 1 and %d", h.Version, spoolVersion)
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != h.SHA256 {
		return nil, errors.New("corrupt: its body's digest differs from its header's")
	}
	var e *turnEnd
	var err error
	if h.Version == 1 {
		e, err = decodeV1(body)
	} else {
		e, err = decodeV2(body)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case e.turnID != turnID:
		return nil, fmt.Errorf("holds turn %q, named %q", e.turnID, turnID)
	case !ids.Token(e.sessionID):
		return nil, errors.New("session id not of its form")
	case e.res.Outcome != OutcomeCompleted && e.res.Outcome != OutcomeCancelled && e.res.Outcome != OutcomeFailed:
		return nil, fmt.Errorf("outcome %q", e.res.Outcome)
	}
	for _, id := range e.unrecorded {
		if !ids.Token(id) {
			return nil, errors.New("an approval's id not of its form")
		}
	}
	for _, ev := range e.events {
		if ev.SessionID != e.sessionID || ev.TurnID != e.turnID {
			return nil, fmt.Errorf("an event of turn %q of session %q", ev.TurnID, ev.SessionID)
		}
		switch ev.Kind {
		case eventUser, eventText, eventThought, eventToolCall, eventToolResult:
		default:
			return nil, fmt.Errorf("an event of kind %q", ev.Kind)
		}
	}
	return e, nil
}

// decodeV2 decodes a body of version 2: its line of JSON, then its text.
func decodeV2(body []byte) (*turnEnd, error) {
	meta, raw, ok := bytes.Cut(body, []byte{'\n'})
	if !ok {
		return nil, errors.New("body: no text after its line")
	}
	var s spooledEnd
	dec := json.NewDecoder(bytes.NewReader(meta))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	if s.TextBytes != int64(len(raw)) {
		return nil, fmt.Errorf("body: %d bytes of text, its line says %d", len(raw), s.TextBytes)
	}
	// One copy: every string of the end is a slice of it.
	text := string(raw)
	var bad error
	str := func(sp span) string {
		off, n := sp[0], sp[1]
		if off < 0 || n < 0 || off > int64(len(text)) || n > int64(len(text))-off {
			bad = fmt.Errorf("body: span %v past its %d bytes of text", sp, len(text))
			return ""
		}
		return text[off : off+n]
	}
	e := &turnEnd{
		sessionID: s.SessionID, turnID: s.TurnID,
		res:  turnResult{Outcome: s.Outcome, StopReason: s.StopReason, Content: str(s.Content), Error: str(s.Error), Said: str(s.Said)},
		said: str(s.Unshown), published: s.Published, unrecorded: s.Unrecorded, updateMap: s.UpdateMap, mapped: true,
	}
	if len(s.Events) > 0 {
		e.events = make([]cpEvent, 0, len(s.Events))
	}
	for _, ev := range s.Events {
		e.events = append(e.events, cpEvent{SessionID: s.SessionID, Seq: ev.Seq, TurnID: s.TurnID, Step: ev.Step, Kind: ev.Kind,
			Surface: ev.Surface, Content: str(ev.Content), CallID: ev.CallID, ToolCallID: ev.ToolCallID, Name: ev.Name, At: ev.At, Marks: ev.Marks})
	}
	if bad != nil {
		return nil, bad
	}
	return e, nil
}

// decodeV1 decodes a body of version 1: one JSON object.
func decodeV1(body []byte) (*turnEnd, error) {
	var s spooledEndV1
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	return &turnEnd{
		sessionID: s.SessionID, turnID: s.TurnID,
		res:  turnResult{Outcome: s.Outcome, StopReason: s.StopReason, Content: s.Content, Error: s.Error, Said: s.Said},
		said: s.Unshown, published: s.Published, unrecorded: s.Unrecorded, updateMap: s.UpdateMap, mapped: true,
		events: s.Events,
	}, nil
}
