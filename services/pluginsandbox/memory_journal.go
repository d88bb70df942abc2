package pluginsandbox

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// A journal keeps what a memory plugin's ledger holds on disk, one file
// per plugin in the sandbox's memory directory (<data_dir>/memories), so
// that a sandbox that restarts gives its memory plugins their entries
// back: before, a restart (a crash, an upgrade, make up again) lost every
// memory a plugin kept in its instance.
//
// The file is a log of records, one JSON line each, appended and synced
// before the call that made them answers; it is rewritten with only what
// is live once it grows past twice what it held after its last rewrite.
// Replicas of the sandbox share the directory: every append and rewrite
// holds an exclusive flock on the file, an append checks that the file it
// locked is still the one at the path (a rewrite renames a new file over
// it), and a rewrite reads the file, not a ledger, so what another replica
// appended is kept.
type journal struct {
	path string
	log  *zap.Logger
	base int64 // the file's size after its last rewrite (or at load)
	// seen is the file as this process last left it, read or written;
	// a file at the path that is not it (another replica appended or
	// rewrote) makes the ledger read it again (refresh). stale is set
	// when an append found records it had not read.
	seen  fileID
	stale bool
	// held is the file seen names, kept open: a file's inode number
	// goes to a new file once the last open of it is closed, and a
	// rewrite's new file took the number of the file this process had
	// read (ext4 gives it back at once), which then passed for it: two
	// rewrites by another replica went unseen, or the new file was read
	// from where the old one ended. Held, the number names no other
	// file; the cost is that the file an idle replica last read keeps
	// its room on disk until its next memory call, or the plugin's
	// unload, once another rewrote it.
	held *os.File
	// A rewrite that failed is tried again once the file has grown by a
	// quarter (retrySize) or retryBackoff has passed (retryTime),
	// whichever comes first: each try reads the whole file, and retried
	// at every append a failing rewrite cost every store a read of up to
	// maxJournalBytes.
	retrySize int64
	retryTime time.Time
	// createTemp makes the rewrite's new file: os.CreateTemp, a failing
	// one in tests (root may write where permissions would refuse).
	createTemp func(dir, pattern string) (*os.File, error)
	// limit is maxJournalBytes; a test's may be smaller.
	limit int64
	// folder is the memory folder as this process last read or made
	// the journal in it: another (another inode) is one removed and
	// made again, by another replica or by hand (folderRemade).
	folder fileID
}

// fileID tells one state of a journal file from another.
type fileID struct {
	dev, ino uint64
	size     int64
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: st.Size}
}

// see records what f, whose lock is held, is now, and holds the file.
func (j *journal) see(f *os.File) {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return
	}
	id := idOf(&st)
	if j.held != nil && id.dev == j.seen.dev && id.ino == j.seen.ino {
		j.seen = id
		return
	}
	// Opened again, not dup'ed: a dup would share f's open file, and
	// with it the flock, past f's close. Under the lock the path names
	// f (a rewrite renames only under the lock of the file it replaces).
	g, err := os.Open(j.path)
	var held unix.Stat_t
	if err == nil && (unix.Fstat(int(g.Fd()), &held) != nil || held.Dev != st.Dev || held.Ino != st.Ino) {
		g.Close()
		err = errors.New("not the file locked")
	}
	if err != nil {
		// Not held, its number may go to another file: the next call
		// reads the whole file.
		j.hold(nil, id)
		j.stale = true
		return
	}
	j.hold(g, id)
}

// hold makes f, the file id names, the one held.
func (j *journal) hold(f *os.File, id fileID) {
	if j.held != nil && j.held != f {
		j.held.Close()
	}
	j.held, j.seen = f, id
}

// close lets go of the file held; the plugin's load is unloaded.
func (j *journal) close() {
	if j != nil {
		j.hold(nil, fileID{})
	}
}

// journalRecord is one line of a journal. The strings are bytes so that
// they are written as base64: a content of control characters would take
// six bytes each as a JSON string, base64 takes 4/3.
type journalRecord struct {
	Op        string `json:"op"` // "store" or "forget"
	Key       []byte `json:"key"`
	Content   []byte `json:"content,omitempty"`
	Category  []byte `json:"category,omitempty"`
	SessionID []byte `json:"session_id,omitempty"`
	Timestamp int64  `json:"timestamp,omitempty"`
}

const (
	opStore  = "store"
	opForget = "forget"
	// maxJournalBytes bounds what a load reads: a rewrite keeps a file
	// under twice its live size (MaxMemoryBytes as base64 and framing)
	// and one record more.
	maxJournalBytes = 3*MaxMemoryBytes*4/3 + 8<<20
	// rewriteSlack is added to twice the base, so a small journal is
	// not rewritten at every append.
	rewriteSlack = 1 << 20
	// maxRecordBytes is more than a record of the largest entry takes.
	maxRecordBytes = 2 << 20
	// retryBackoff is how long a failed rewrite waits for its next try
	// when the file does not grow (at maxJournalBytes, appends are
	// refused).
	retryBackoff = 30 * time.Second
)

func storeRecord(e wasmhost.MemoryEntry) journalRecord {
	return journalRecord{Op: opStore, Key: []byte(e.Key), Content: []byte(e.Content), Category: []byte(e.Category),
		SessionID: []byte(e.SessionID), Timestamp: e.Timestamp}
}

func (r journalRecord) entry() wasmhost.MemoryEntry {
	return wasmhost.MemoryEntry{Key: string(r.Key), Content: string(r.Content), Category: string(r.Category),
		SessionID: string(r.SessionID), Timestamp: r.Timestamp}
}

// openJournal names the journal of plugin in dir; the directory is made
// if it is missing.
func openJournal(dir, plugin string, log *zap.Logger) (*journal, error) {
	if !manifest.NamePattern.MatchString(plugin) {
		return nil, fmt.Errorf("memory journal: plugin name %q is not a file name", plugin)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("memory journal: %w", err)
	}
	return &journal{path: datadir.MemoryJournal(dir, plugin), log: log, createTemp: os.CreateTemp, limit: maxJournalBytes}, nil
}

// lockedFile opens the journal with flags and holds an exclusive flock on
// it, on the file that is at the path once the lock is held.
func (j *journal) lockedFile(flags int) (*os.File, error) {
	for range 100 {
		f, err := os.OpenFile(j.path, flags, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, err
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(j.path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return f, nil
		}
		f.Close() // rewritten meanwhile: lock the new file
	}
	return nil, fmt.Errorf("memory journal %s: replaced at every try", j.path)
}

// load replays the journal into a ledger's entries, in the order they
// were last stored. A last line cut short (the process stopped while
// appending) is cut off the file; anything else unreadable is an error,
// and the file is left as it is.
func (j *journal) load(l *ledger) (torn int, err error) {
	f, err := j.lockedFile(os.O_RDWR | os.O_CREATE)
	if err != nil {
		return 0, fmt.Errorf("memory journal: %w", err)
	}
	defer f.Close()
	data, err := j.readAll(f)
	if err != nil {
		return 0, err
	}
	whole := bytes.LastIndexByte(data, '\n') + 1
	if err := replay(data[:whole], l); err != nil {
		return 0, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	if torn, err = cutTorn(f); err != nil {
		return 0, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	// A rewrite cut short left its temporary file; none is under way
	// while the lock is held.
	if stale, err := filepath.Glob(j.path + ".*"); err == nil {
		for _, p := range stale {
			_ = os.Remove(p)
		}
	}
	j.base = int64(whole)
	j.see(f)
	j.folder = folderOf(j.path)
	return torn, nil
}

// folderOf identifies the folder the file at path is in; zero if it is
// gone.
func folderOf(path string) fileID {
	var st unix.Stat_t
	if unix.Stat(filepath.Dir(path), &st) != nil {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}
}

// folderRemade reports whether the memory folder is another than the
// one this process last read the journal in: it was removed and made
// again.
func (j *journal) folderRemade() bool {
	now := folderOf(j.path)
	return j.folder != (fileID{}) && now != (fileID{}) && now != j.folder
}

// unread returns the whole records other replicas appended to the file
// this process holds since it last read it. Once the folder is removed
// the file held is the only place they are left.
func (j *journal) unread() []journalRecord {
	if j.held == nil || j.stale {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(int(j.held.Fd()), &st) != nil || st.Dev != j.seen.dev || st.Ino != j.seen.ino ||
		st.Size <= j.seen.size || st.Size > j.limit {
		return nil
	}
	data := make([]byte, st.Size-j.seen.size)
	if _, err := j.held.ReadAt(data, j.seen.size); err != nil {
		return nil
	}
	var out []journalRecord
	if err := eachRecord(data[:bytes.LastIndexByte(data, '\n')+1], func(r journalRecord) { out = append(out, r) }); err != nil {
		j.log.Warn("memory journal removed; what other replicas appended to it is not read", zap.String("path", j.path), zap.Error(err))
		return nil
	}
	return out
}

// readAll reads f, whose lock is held, from where it is to its end, if
// that is within the journal's limit. It reads into one buffer of the
// file's size: io.ReadAll's growing ones were a quarter of a 7.5 MB
// journal's read and decode, their copies and the clearing of each.
func (j *journal) readAll(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	at, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	n := max(st.Size()-at, 0)
	if n > j.limit {
		return nil, fmt.Errorf("memory journal %s: larger than %d bytes", j.path, j.limit)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	return data, nil
}

// cutTorn cuts off the end of the file f after its last newline, a record
// the process writing it did not finish, and reports how many bytes it
// cut. A record is at most the entry bounds as base64, well within the
// last maxRecordBytes.
func cutTorn(f *os.File) (int, error) {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return 0, err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, st.Size()-1); err != nil {
		return 0, err
	}
	if last[0] == '\n' {
		return 0, nil
	}
	from := max(st.Size()-maxRecordBytes, 0)
	tail := make([]byte, st.Size()-from)
	if _, err := f.ReadAt(tail, from); err != nil {
		return 0, err
	}
	keep := from + int64(bytes.LastIndexByte(tail, '\n')+1) // from, when tail has none
	if keep == from && from > 0 {
		return 0, errors.New("its end is not a record")
	}
	if err := f.Truncate(keep); err != nil {
		return 0, fmt.Errorf("cut its torn end: %w", err)
	}
	return int(st.Size() - keep), nil
}

// replay applies the records in data to l.
func replay(data []byte, l *ledger) error {
	return eachRecord(data, func(r journalRecord) { r.applyTo(l) })
}

// eachRecord checks and decodes the records in data, whole lines, and
// gives each to fn in order.
func eachRecord(data []byte, fn func(journalRecord)) error {
	line := 0
	for len(data) > 0 {
		line++
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return fmt.Errorf("line %d: cut short", line)
		}
		var r journalRecord
		if err := decodeRecord(data[:i], &r); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		data = data[i+1:]
		if r.Op != opStore && r.Op != opForget {
			return fmt.Errorf("line %d: unknown op %q", line, r.Op)
		}
		fn(r)
	}
	return nil
}

// decodeRecord decodes one line of a journal. A line as this sandbox
// writes it (one object, no spaces, the strings base64 and the names as
// journalRecord's tags) is read here; any other is left to encoding/json,
// so what a line means is what encoding/json makes of it. Its check of
// the whole line before it decodes it, and the decode's second pass, were
// 47% of the read of a 7.5 MB journal.
func decodeRecord(line []byte, r *journalRecord) error {
	if plainRecord(line, r) {
		return nil
	}
	*r = journalRecord{}
	return json.Unmarshal(line, r)
}

// plainRecord decodes line into r if it is written as this sandbox writes
// a record, and reports whether it was.
func plainRecord(line []byte, r *journalRecord) bool {
	if len(line) < 2 || line[0] != '{' || line[len(line)-1] != '}' {
		return false
	}
	b := line[1 : len(line)-1]
	for len(b) > 0 {
		var ok bool
		if b, ok = plainMember(b, r); !ok {
			return false
		}
		if len(b) > 0 {
			if b[0] != ',' || len(b) == 1 {
				return false
			}
			b = b[1:]
		}
	}
	return true
}

// plainMember decodes the member at the start of b into r, and returns
// what follows it.
func plainMember(b []byte, r *journalRecord) (rest []byte, ok bool) {
	name, b, ok := plainString(b)
	if !ok || len(b) == 0 || b[0] != ':' {
		return nil, false
	}
	b = b[1:]
	var field *[]byte
	switch string(name) {
	case "op":
		v, rest, ok := plainString(b)
		switch {
		case ok && string(v) == opStore:
			r.Op = opStore
		case ok && string(v) == opForget:
			r.Op = opForget
		default:
			return nil, false
		}
		return rest, true
	case "timestamp":
		end := jsonstr.NumberEnd(b, 0)
		if end < 0 {
			return nil, false
		}
		ts, err := strconv.ParseInt(string(b[:end]), 10, 64)
		if err != nil {
			return nil, false
		}
		r.Timestamp = ts
		return b[end:], true
	case "key":
		field = &r.Key
	case "content":
		field = &r.Content
	case "category":
		field = &r.Category
	case "session_id":
		field = &r.SessionID
	default:
		return nil, false
	}
	v, rest, ok := plainString(b)
	// base64 skips a carriage return, which JSON refuses in a string.
	if !ok || bytes.IndexByte(v, '\r') >= 0 {
		return nil, false
	}
	dec := make([]byte, base64.StdEncoding.DecodedLen(len(v)))
	n, err := base64.StdEncoding.Decode(dec, v)
	if err != nil {
		return nil, false
	}
	*field = dec[:n]
	return rest, true
}

// plainString returns the JSON string at the start of b when it has no
// escapes, and what follows it.
func plainString(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	end := bytes.IndexByte(b[1:], '"')
	if end < 0 || bytes.IndexByte(b[1:1+end], '\\') >= 0 {
		return nil, nil, false
	}
	return b[1 : 1+end], b[2+end:], true
}

// applyTo makes the change r records in l.
func (r journalRecord) applyTo(l *ledger) {
	if r.Op == opStore {
		l.stored(r.entry())
	} else {
		l.forgot(string(r.Key))
	}
}

// append writes records and syncs them, and rewrites the journal once it
// has grown past twice its base. Records that would take the file past
// maxJournalBytes, which a load refuses to read, are refused unless a
// rewrite first makes room for them.
func (j *journal) append(records ...journalRecord) error {
	return j.appendChecked(nil, records...)
}

// unreadCheck is given the journal file, whose lock is held, when other
// replicas changed it since this process last read it, and from where
// in it their records are (0: the whole file is to be read); an error
// refuses the append.
type unreadCheck func(f *os.File, from int64) error

// appendChecked is append, with check run on what other replicas wrote
// to the file before the records are.
func (j *journal) appendChecked(check unreadCheck, records ...journalRecord) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, r := range records {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	err := j.appendLocked(buf.Bytes(), true, check)
	if errors.Is(err, errRewritten) {
		err = j.appendLocked(buf.Bytes(), false, check) // to the new file
	}
	return err
}

// errRewritten is an append that rewrote the file to make room, and has
// to lock the new one.
var errRewritten = errors.New("memory journal rewritten to make room")

// appendLocked is append on the file at the path, under its lock; with
// mayRewrite unset, records that do not fit are refused without a try.
func (j *journal) appendLocked(data []byte, mayRewrite bool, check unreadCheck) error {
	f, err := j.lockedFile(os.O_RDWR | os.O_APPEND | os.O_CREATE)
	if err != nil {
		return fmt.Errorf("memory journal: %w", err)
	}
	defer f.Close()
	// A replica that stopped while appending left a record cut short; a
	// record written after it would make it a line in the middle.
	if _, err := cutTorn(f); err != nil {
		return fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	var before unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &before); err != nil {
		return fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	if idOf(&before) != j.seen {
		if check != nil {
			from := int64(0)
			if !j.stale && before.Dev == j.seen.dev && before.Ino == j.seen.ino && before.Size >= j.seen.size {
				from = j.seen.size
			}
			if err := check(f, from); errors.Is(err, errMemoryFull) {
				return err
			} else if err != nil {
				return fmt.Errorf("memory journal %s: %w", j.path, err)
			}
		}
		j.stale = true // records of another replica's since this one read
	}
	if before.Size+int64(len(data)) > j.limit {
		// Only rewrites that fail let the file come this far.
		if !mayRewrite || !j.mayRetry(before.Size) {
			return fmt.Errorf("memory journal %s: full (%d bytes), rewrites failing", j.path, before.Size)
		}
		if err := j.tryRewrite(f, before.Size); err != nil {
			return fmt.Errorf("memory journal %s: full (%d bytes) and not rewritten: %w", j.path, before.Size, err)
		}
		return errRewritten
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	j.see(f)
	st, err := f.Stat()
	if err != nil || st.Size() <= 2*j.base+rewriteSlack || !j.mayRetry(st.Size()) {
		return nil
	}
	// The records are written and synced: a failed rewrite leaves the
	// log as it was, whole, and is no failure of the call (before, the
	// store answered "not written to disk" for what was).
	if err := j.tryRewrite(f, st.Size()); err != nil {
		j.log.Warn("memory journal not rewritten; it stays a longer log", zap.String("path", j.path), zap.Error(err))
	}
	return nil
}

// recreate makes the journal's folder again and writes l's entries, in
// the order they were last stored, to the journal: the folder and the
// file in it were removed. What other replicas appended to the file
// this process last read, and it had not, is applied to l first (and
// returned, for the instance), then mine, changes l holds already that
// are newer: before, the new journal lacked them, and the replicas that
// had made them forgot them as well at their next call.
func (j *journal) recreate(l *ledger, mine ...journalRecord) (ops []journalRecord, err error) {
	if err := os.MkdirAll(filepath.Dir(j.path), 0o700); err != nil {
		return nil, fmt.Errorf("memory journal: %w", err)
	}
	ops = j.unread()
	for _, r := range ops {
		r.applyTo(l)
	}
	for _, r := range mine {
		r.applyTo(l)
	}
	live := l.inOrder()
	records := make([]journalRecord, len(live))
	for i, le := range live {
		records[i] = storeRecord(le.e)
	}
	j.log.Warn("memory journal's folder was removed; made again with the entries held", zap.String("path", j.path), zap.Int("entries", len(records)),
		zap.Int("unread_changes", len(ops)))
	if err := j.append(records...); err != nil {
		return ops, err
	}
	j.folder = folderOf(j.path)
	return ops, nil
}

// merge writes into the journal, which fresh holds as read, the entries
// of mine it lacks, and applies them to fresh: the folder was made again
// by another replica, with what that one held.
func (j *journal) merge(mine, fresh *ledger) error {
	var records []journalRecord
	for _, le := range mine.inOrder() {
		if _, held := fresh.entries[le.e.Key]; !held {
			records = append(records, storeRecord(le.e))
		}
	}
	if len(records) == 0 {
		return nil
	}
	j.log.Warn("memory journal's folder was made again by another; the entries it lacks are written to it", zap.String("path", j.path),
		zap.Int("entries", len(records)))
	if err := j.append(records...); err != nil {
		return err
	}
	for _, r := range records {
		r.applyTo(fresh)
	}
	return nil
}

// mayRetry reports whether a rewrite may be tried at size: none failed
// since the last that succeeded, or the file has grown to the failure's
// retrySize, or its retryTime has come.
func (j *journal) mayRetry(size int64) bool {
	return j.retrySize == 0 || size >= j.retrySize || !time.Now().Before(j.retryTime)
}

// tryRewrite rewrites the journal of size bytes, whose lock f holds, and
// sets when a failure is tried again.
func (j *journal) tryRewrite(f *os.File, size int64) error {
	if err := j.rewrite(f); err != nil {
		j.retrySize = size + max(rewriteSlack, size/4)
		j.retryTime = time.Now().Add(retryBackoff)
		return err
	}
	j.retrySize, j.retryTime = 0, time.Time{}
	return nil
}

// rewrite replaces the journal, whose lock f holds, with its live
// entries, in the order they were last stored.
func (j *journal) rewrite(f *os.File) error {
	// The new file first: a directory that refuses it costs no read.
	tmp, err := j.createTemp(filepath.Dir(j.path), filepath.Base(j.path)+".*")
	if err != nil {
		return err
	}
	held := false
	defer func() {
		if !held {
			tmp.Close()
			os.Remove(tmp.Name()) // fails once renamed
		}
	}()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	// Rewritten from a part of it, the file would lose what lies past.
	data, err := j.readAll(f)
	if err != nil {
		return err
	}
	if i := bytes.LastIndexByte(data, '\n'); i+1 < len(data) {
		data = data[:i+1]
	}
	live := newLedger(nil)
	if err := replay(data, live); err != nil {
		return fmt.Errorf("memory journal %s: not rewritten: %w", j.path, err)
	}
	w := bufio.NewWriterSize(tmp, 1<<20)
	enc := json.NewEncoder(w)
	for _, le := range live.inOrder() {
		if err := enc.Encode(storeRecord(le.e)); err != nil {
			return err
		}
	}
	err = w.Flush()
	if err == nil {
		err = tmp.Sync()
	}
	var st unix.Stat_t
	if err == nil {
		err = unix.Fstat(int(tmp.Fd()), &st)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), j.path)
	}
	if err != nil {
		return fmt.Errorf("memory journal %s: rewrite: %w", j.path, err)
	}
	if d, err := os.Open(filepath.Dir(j.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	// The file as this process wrote it, not as a stat of the path
	// finds it: another replica may have appended to it since the
	// rename, records this one has not read.
	j.base = st.Size
	if !j.stale {
		j.hold(tmp, idOf(&st))
		held = true
	}
	return nil
}

// changed reports whether the file at the path is no longer the one this
// process last read or wrote: another replica appended to it or rewrote
// it. It costs a stat.
func (j *journal) changed() bool {
	var st unix.Stat_t
	if j.stale || unix.Stat(j.path, &st) != nil {
		return true
	}
	return idOf(&st) != j.seen
}

// update brings l up to the journal another replica changed, and returns
// the records that take an instance holding l's entries as they were to
// what l holds now, in order: those the others appended, when that is all
// that changed, else what changesTo finds. Before, the instance was
// rebuilt and given every entry again, 0.45 s at MaxMemoryEntries, at the
// first call after any change another replica made. exact is false when
// no records can (see changesTo): the instance is to be rebuilt.
func (j *journal) update(l *ledger) (ops []journalRecord, exact bool, err error) {
	if ops, ok, err := j.appended(l); err != nil || ok {
		return ops, ok, err
	}
	var mine *ledger
	if j.folderRemade() {
		// Read before the load lets go of the file held.
		mine = l.clone()
		for _, r := range j.unread() {
			r.applyTo(mine)
		}
	}
	_, statErr := os.Stat(j.path)
	fresh := newLedger(nil)
	if _, err := j.load(fresh); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// The memory folder was removed: made again with what l
			// holds, as a change's record makes it (ledger.record).
			// Before, every call failed here, the journal unreadable,
			// until a restart found the folder empty.
			ops, err := j.recreate(l)
			return ops, true, err
		}
		return nil, false, err
	}
	if mine != nil {
		if err := j.merge(mine, fresh); err != nil {
			return nil, false, err
		}
	}
	if len(fresh.entries) == 0 && len(l.entries) > 0 {
		// A purge deletes the journal, and every replica drops what it
		// held with it; so does a deletion by hand, which before went
		// unsaid: the plugin's memories were gone without a word.
		if errors.Is(statErr, fs.ErrNotExist) {
			j.log.Warn("memory journal deleted (plugin remove --purge, or by hand); the plugin's entries are dropped with it",
				zap.String("path", j.path), zap.Int("entries", len(l.entries)))
		} else {
			j.log.Warn("memory journal replaced by an empty one (deleted, or every entry forgotten by another replica); the plugin's entries are dropped",
				zap.String("path", j.path), zap.Int("entries", len(l.entries)))
		}
	}
	j.stale = false
	ops, exact = changesTo(l, fresh)
	l.entries, l.seq, l.bytes = fresh.entries, fresh.seq, fresh.bytes
	return ops, exact, nil
}

// appended reads the records other replicas appended since this process
// last read or wrote the file, applies them to l and returns them. ok is
// false, and nothing read, when more changed: the file was rewritten, or
// this process appended after records it had not read (stale), which its
// instance has after its own.
func (j *journal) appended(l *ledger) (ops []journalRecord, ok bool, err error) {
	if j.stale {
		return nil, false, nil
	}
	f, err := j.lockedFile(os.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("memory journal: %w", err)
	}
	defer f.Close()
	if _, err := cutTorn(f); err != nil {
		return nil, false, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, false, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	now := idOf(&st)
	if now.dev != j.seen.dev || now.ino != j.seen.ino || now.size < j.seen.size {
		return nil, false, nil
	}
	if now.size > j.limit {
		return nil, false, fmt.Errorf("memory journal %s: larger than %d bytes", j.path, j.limit)
	}
	data := make([]byte, now.size-j.seen.size)
	if _, err := f.ReadAt(data, j.seen.size); err != nil {
		return nil, false, fmt.Errorf("memory journal %s: %w", j.path, err)
	}
	// Decoded whole before l changes: a record that does not decode
	// leaves l as it was.
	if err := eachRecord(data, func(r journalRecord) { ops = append(ops, r) }); err != nil {
		return nil, false, fmt.Errorf("memory journal %s, from byte %d: %w", j.path, j.seen.size, err)
	}
	for _, r := range ops {
		r.applyTo(l)
	}
	j.seen = now
	return ops, true, nil
}

// changesTo returns forgets and stores that take an instance holding
// have's entries, stored in have's order, to one holding want's stored in
// want's order, when there are such: every entry the two hold alike comes,
// in want's order, before all the others and in have's order (another
// replica's rewrite of the journal after it stored entries of its own).
// An entry held alike that want has later than one it changed (stored
// again, or after an entry this process stored past records it had not
// read) makes ok false: only a rebuild gives the order.
func changesTo(have, want *ledger) (ops []journalRecord, ok bool) {
	var alike []string // in have's order
	for _, le := range have.inOrder() {
		if w, held := want.entries[le.e.Key]; held && sameEntry(w.e, le.e) {
			alike = append(alike, le.e.Key)
		} else {
			// A changed entry is forgotten first, so that its store
			// makes it the newest whatever the plugin does with a key
			// stored again.
			ops = append(ops, journalRecord{Op: opForget, Key: []byte(le.e.Key)})
		}
	}
	i, stored := 0, false
	for _, le := range want.inOrder() {
		if h, held := have.entries[le.e.Key]; held && sameEntry(h.e, le.e) {
			if stored || alike[i] != le.e.Key {
				return nil, false
			}
			i++
			continue
		}
		ops, stored = append(ops, storeRecord(le.e)), true
	}
	return ops, true
}

// sameEntry compares what a journal keeps of two entries.
func sameEntry(a, b wasmhost.MemoryEntry) bool {
	return a.Key == b.Key && a.Content == b.Content && a.Category == b.Category &&
		a.SessionID == b.SessionID && a.Timestamp == b.Timestamp
}

// errJournal is a journal that could not be read when a call needed it.
var errJournal = errors.New("memory journal unreadable")

// errNotRecorded is a change the plugin made that its journal does not
// hold: it does not outlive a restart of the sandbox.
var errNotRecorded = errors.New("not written to the memory journal")
