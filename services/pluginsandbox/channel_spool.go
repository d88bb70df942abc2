package pluginsandbox

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// channelSpool keeps one channel alias's accepted messages on disk, a
// file each, from the listener's 202 until the message is done with (its
// turn answered, its sender told why not, or the plugin read it into no
// message). The queue and the backlog live in the replica's memory, and a
// replica that died holding them (a crash, a kill, a stop past its grace)
// lost them without a word to their senders or the operator. Now the
// replica that binds the alias next, or any running replica of it, adopts
// the dead one's files and delivers them again: at least once, as a
// rebind does, so a turn the death cut runs again from its start.
//
// Local files rather than PostgreSQL: the sandbox has no database, its
// replicas share the data directory (as the compile cache and the
// memory journals), and an fsync of a file under 1 MiB is the same
// durability without a new dependency on the sandbox's path.
//
// Layout: <spool>/<alias in hex>/<owner>/, owner one process's folder,
// flocked (its file "lock") for as long as the process lives, so that a
// folder whose lock can be taken is a dead owner's; its messages are
// <seq>.msg, the sequence zero-padded so that the names sort in the order
// the listener accepted them.
type channelSpool struct {
	dir  string // <spool>/<alias in hex>
	own  string // dir/<owner>
	lock *os.File
	seq  atomic.Uint64
	log  *zap.Logger

	mu sync.Mutex
	// held are the files of the messages the plugin turned the queued
	// ones into, until each is done with. Bounded as the messages are
	// (the queue, the backlog).
	held map[*wasmhost.ChannelMessage][]string
}

// spoolLock is the file an owner's folder is flocked by.
const spoolLock = "lock"

// spoolExt names a kept message.
const spoolExt = ".msg"

// openSpool makes this process's folder under root for alias and locks it.
func openSpool(root, alias string, log *zap.Logger) (*channelSpool, error) {
	dir := filepath.Join(root, hex.EncodeToString([]byte(alias)))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	own, err := os.MkdirTemp(dir, "r-")
	if err != nil {
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(own, spoolLock), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		_ = os.RemoveAll(own)
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		_ = os.RemoveAll(own)
		return nil, fmt.Errorf("channel spool: lock %s: %w", own, err)
	}
	return &channelSpool{dir: dir, own: own, lock: f, log: log, held: map[*wasmhost.ChannelMessage][]string{}}, nil
}

// write keeps raw and returns its file, the tag its queue entry carries.
// A nil spool keeps nothing.
func (sp *channelSpool) write(raw []byte) (string, error) {
	if sp == nil {
		return "", nil
	}
	path := filepath.Join(sp.own, fmt.Sprintf("%020d%s", sp.seq.Add(1), spoolExt))
	if _, err := atomicfile.Create(path, raw, 0o600); err != nil {
		return "", fmt.Errorf("channel spool: keep a message: %w", err)
	}
	return path, nil
}

// drop forgets the messages kept in files.
func (sp *channelSpool) drop(files ...string) {
	if sp == nil {
		return
	}
	for _, f := range files {
		if f == "" {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Kept, it is delivered again once this process is gone.
			sp.log.Warn("channel spool: a delivered message's file not removed", zap.Error(err))
		}
	}
}

// polled ties msg, what the plugin made of the queued messages in files,
// to them; nil msg (the plugin made nothing of them) drops them.
func (sp *channelSpool) polled(msg *wasmhost.ChannelMessage, files []string) {
	if sp == nil || len(files) == 0 {
		return
	}
	if msg == nil {
		sp.drop(files...)
		return
	}
	sp.mu.Lock()
	sp.held[msg] = append(sp.held[msg], files...)
	sp.mu.Unlock()
}

// done drops msg's files: it was answered, or its sender told.
func (sp *channelSpool) done(msg *wasmhost.ChannelMessage) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	files := sp.held[msg]
	delete(sp.held, msg)
	sp.mu.Unlock()
	sp.drop(files...)
}

// adopt queues, into q, the messages of the owners that are gone, in the
// order each accepted them, moving their files into this process's
// folder; what q has no room for stays where it is, for a later adopt.
// It returns how many it queued.
func (sp *channelSpool) adopt(q *wasmhost.InboundQueue) int {
	if sp == nil {
		return 0
	}
	owners, err := os.ReadDir(sp.dir)
	if err != nil {
		sp.log.Warn("channel spool: not read", zap.Error(err))
		return 0
	}
	n := 0
	for _, o := range owners {
		dead := filepath.Join(sp.dir, o.Name())
		if !o.IsDir() || dead == sp.own {
			continue
		}
		got, full := sp.adoptFrom(dead, q)
		n += got
		if full {
			break
		}
	}
	if n > 0 {
		if d, err := os.Open(sp.own); err == nil {
			_ = d.Sync()
			d.Close()
		}
		sp.log.Warn("channel messages of a replica that died re-queued, to be delivered again", zap.Int("messages", n))
	}
	return n
}

// adoptFrom adopts the messages of owner folder dead if its owner is gone
// (its lock free), and removes the folder once it holds none. full is q
// refusing one.
func (sp *channelSpool) adoptFrom(dead string, q *wasmhost.InboundQueue) (n int, full bool) {
	// Never created: a folder whose lock another adopter removed is
	// gone, and one whose owner is starting has it in a moment.
	f, err := os.OpenFile(filepath.Join(dead, spoolLock), os.O_RDWR, 0)
	if err != nil {
		return 0, false
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return 0, false // alive, or another replica adopts it now
	}
	entries, err := os.ReadDir(dead)
	if err != nil {
		return 0, false
	}
	var names []string
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, spoolExt) && !strings.HasPrefix(name, ".") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	left := len(names)
	for _, name := range names {
		from := filepath.Join(dead, name)
		raw, err := os.ReadFile(from)
		if err != nil {
			sp.log.Warn("channel spool: a dead replica's message not read", zap.Error(err))
			continue
		}
		to := filepath.Join(sp.own, fmt.Sprintf("%020d%s", sp.seq.Add(1), spoolExt))
		if err := os.Rename(from, to); err != nil {
			sp.log.Warn("channel spool: a dead replica's message not taken over", zap.Error(err))
			continue
		}
		if err := q.PushTagged(json.RawMessage(raw), to); err != nil {
			if errors.Is(err, wasmhost.ErrInboundFull) {
				_ = os.Rename(to, from)
				return n, true
			}
			// Not a JSON object: the listener never queued such.
			sp.log.Warn("channel spool: a dead replica's message dropped", zap.Error(err))
			sp.drop(to)
		}
		left--
		n++
	}
	if left == 0 {
		// Under the lock: an adopter that opens the lock after this
		// finds none and leaves the folder alone.
		_ = os.Remove(filepath.Join(dead, spoolLock))
		_ = os.RemoveAll(dead)
	}
	return n, false
}

// close removes this process's folder if it holds no message, and
// releases its lock: what it still holds is the next owner's to adopt.
func (sp *channelSpool) close() {
	if sp == nil {
		return
	}
	entries, err := os.ReadDir(sp.own)
	empty := err == nil
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), spoolExt) {
			empty = false
		}
	}
	if empty {
		_ = os.RemoveAll(sp.own)
	}
	sp.lock.Close()
}

// spool returns alias's spool, opened at its first binding in this
// process; nil without Config.ChannelSpoolDir.
func (s *Server) spool(alias string) (*channelSpool, error) {
	if s.cfg.ChannelSpoolDir == "" {
		return nil, nil
	}
	s.spoolMu.Lock()
	defer s.spoolMu.Unlock()
	if sp := s.spools[alias]; sp != nil {
		return sp, nil
	}
	sp, err := openSpool(s.cfg.ChannelSpoolDir, alias, s.logger.With(zap.String("channel", alias)))
	if err != nil {
		return nil, err
	}
	if s.spools == nil {
		s.spools = map[string]*channelSpool{}
	}
	s.spools[alias] = sp
	return sp, nil
}

// closeSpools closes every spool; the bindings have stopped.
func (s *Server) closeSpools() {
	s.spoolMu.Lock()
	defer s.spoolMu.Unlock()
	for alias, sp := range s.spools {
		sp.close()
		delete(s.spools, alias)
	}
}
