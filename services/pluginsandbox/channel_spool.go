package pluginsandbox

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/ids"
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
// Layout: <spool>/<alias in hex>/p-<plugin in hex>/<owner>/, owner one
// process's folder, flocked (its file "lock") for as long as the process
// lives, so that a folder whose lock can be taken is a dead owner's; its
// messages are <seq>-<host id>.msg, the sequence zero-padded so that the
// names sort in the order the listener accepted them.
//
// The plugin is part of the key because a message's shape is its
// plugin's: keyed by the alias alone, a binding moved to another plugin
// while a replica was down read the dead replica's messages, meant for
// the old plugin, into the new one (and its agent answered them). The
// messages of another plugin stay where they are, for a binding of that
// plugin under the alias (its spool adopts them as its own), and the
// binding that finds them logs how many wait (strays).
//
// Folders of the release before this layout (<alias in hex>/<owner>/)
// name no plugin. They were logged and left, so an upgrade that cut a
// delivery forgot its message, answered 202, for good. They are now
// adopted by the alias's binding, whatever its plugin, before its own
// layout's: the release that wrote them bound the alias to that plugin
// unless the binding was moved while the sandbox was down, and a plugin
// that cannot read a foreign message reads it into none (dropped, as a
// message it refuses). Adopted, they move into the new layout, so this
// happens once. Only regular files are read (never through a symlink),
// each at most maxInboundBody bytes; what is refused is removed and
// counted in the log.
//
// Retention: none by itself. Each kept message was answered 202, and a
// spool that dropped what waited past an age or a size would break that
// promise without a word to its sender (whose notice goes through the
// plugin, which may be gone). One owner folder holds at most its queue
// and backlog; what waits for a plugin nobody binds again is marked past
// 24 h or 64 MiB by clawmesh status, spool list and health --config-dir
// (cmd/clawmesh/spoolstate.go), and clawmesh spool drop removes it under
// each owner's lock, as adopt takes it, never while a replica holds one.
//
// Disk bound: channels.plugin.<alias>.spool_max_mb (64 MiB by default)
// over the plugin's folder under the alias, every owner's messages
// together (the dead ones', which a restart finds on disk, too), each
// counted in whole 4 KiB blocks so that small messages cannot take more
// disk than they are counted for. A message that would pass it is refused
// (503, Retry-After) before it is written, so nothing answered 202 is
// dropped to keep the bound: the spool takes messages again once delivery
// brings it below. Without it a sender holding the channel's token, with
// a replica that died (or rebinds) again and again, or a plugin never
// bound again, could fill the disk 32 MiB a time. Every owner is counted
// as it is at the message, under a lock of the plugin's folder: the live
// ones by the count each keeps in its folder, the dead ones by their
// files (channel_spool_bound.go), so that replicas taking messages at
// once never pass the bound together. Not bounded together over aliases: the
// operator's own settings (aliases, plugins bound under them, each one's
// bound) bound the sum, and a token reaches one alias.
//
// The host id is the one the message is delivered with when its plugin
// gives it none (wasmhost.ChannelMessage.ID empty): given at the 202 and
// kept in the name, so that a message delivered again from the spool has
// the idempotency key (messageKey) of its first delivery, and its cut
// turn resumes rather than running again with its tools. A fresh id at
// each poll made every redelivery a new message to the session service.
type channelSpool struct {
	alias string // <spool>/<alias in hex>
	dir   string // alias/p-<plugin in hex>
	own   string // dir/<owner>
	lock  *os.File
	seq   atomic.Uint64
	log   *zap.Logger

	// ledger is own's count for the other owners (spoolLedger), and
	// dirLock dir, flocked while a message is checked and reserved
	// (lockBound, channel_spool_bound.go).
	ledger, dirLock *os.File
	// strayed is set once the spool logged the messages of other plugins
	// (or of the old layout) left under its alias: once per process.
	strayed atomic.Bool

	// ownCost is what this process's folder holds, counted as the bound
	// counts (spoolCost): reserved, adopted, not yet dropped; changed
	// under lockBound, with the ledger. otherCost is what the plugin's
	// other owner folders held at the last count.
	ownCost, otherCost atomic.Int64
	// boundMu orders this process's holders of dirLock (an flock is the
	// open file's, not a goroutine's); scans, under it, are the owner
	// folders counted by their files (othersNow).
	boundMu sync.Mutex
	scans   map[string]ownerScan
	// full is set once a message was refused for the bound, until one
	// is taken or the spool drains below it; refused is that message's
	// cost. While set, the plugin's folder holds spoolFullMark, which
	// status reads.
	full    atomic.Bool
	refused atomic.Int64

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

// spoolPluginPrefix begins the name of a plugin's folder under an alias.
const spoolPluginPrefix = "p-"

// spoolFullMark, in a plugin's folder under an alias, says that the
// spool refuses new messages for its bound: JSON, spoolFull. Status and
// health read it (cmd/clawmesh/spoolstate.go).
const spoolFullMark = "full"

// spoolFull is spoolFullMark's content.
type spoolFull struct {
	BoundBytes int64     `json:"bound_bytes"`
	Since      time.Time `json:"since"`
}

// spoolBlock is the unit a kept message is counted in: a file takes at
// least a block of most file systems, so 64 MiB of 100-byte messages
// would take 2.6 GiB of disk counted by their bytes.
const spoolBlock = 4096

// spoolCost is what a kept message of n bytes counts towards the bound.
func spoolCost(n int64) int64 {
	return max(spoolBlock, (n+spoolBlock-1)&^(spoolBlock-1))
}

// errSpoolFull: a message would take the spool past its bound.
var errSpoolFull = errors.New("channel spool: at its bound")

// openSpool makes this process's folder under root for alias, bound to
// plugin, and locks it.
func openSpool(root, alias, plugin string, log *zap.Logger) (*channelSpool, error) {
	aliasDir := filepath.Join(root, hex.EncodeToString([]byte(alias)))
	dir := filepath.Join(aliasDir, spoolPluginPrefix+hex.EncodeToString([]byte(plugin)))
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
	// The plugin's folder holds own from here on, so it is not removed
	// (spool drop removes it empty) while this lock on it is held.
	dirLock, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		f.Close()
		_ = os.RemoveAll(own)
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	ledger, err := openLedger(own)
	if err != nil {
		dirLock.Close()
		f.Close()
		_ = os.RemoveAll(own)
		return nil, err
	}
	sp := &channelSpool{alias: aliasDir, dir: dir, own: own, lock: f, ledger: ledger, dirLock: dirLock, log: log,
		held: map[*wasmhost.ChannelMessage][]string{}}
	// What the replicas before this one left counts from the first
	// message: a restart began at zero and took another bound's worth.
	sp.lockBound()
	sp.otherCost.Store(sp.othersNow(false))
	sp.unlockBound()
	return sp, nil
}

// spoolSeqLen is the length of a kept message's sequence number.
const spoolSeqLen = 20

// write keeps raw, with a host id of its own (hostIDOf), and returns its
// file, the tag its queue entry carries; errSpoolFull when it would take
// the spool past bound bytes, before anything is written. A nil spool
// keeps nothing.
func (sp *channelSpool) write(raw []byte, bound int64) (string, error) {
	if sp == nil {
		return "", nil
	}
	cost := spoolCost(int64(len(raw)))
	ok, err := sp.reserve(cost, bound)
	if err != nil {
		return "", err
	}
	if !ok {
		sp.refused.Store(cost)
		if !sp.full.Swap(true) {
			sp.markFull(bound)
		}
		return "", errSpoolFull
	}
	if sp.full.Swap(false) {
		sp.unmarkFull()
	}
	path := filepath.Join(sp.own, fmt.Sprintf("%0*d-%s%s", spoolSeqLen, sp.seq.Add(1), ids.New(hostIDPrefix), spoolExt))
	// Written after the lock is let go: reserved, it is counted by
	// every owner from now on, and writes sync at once.
	if _, err := atomicfile.Create(path, raw, 0o600); err != nil {
		sp.release(cost)
		return "", fmt.Errorf("channel spool: keep a message: %w", err)
	}
	return path, nil
}

// used is what the spool holds, as the bound counts it.
func (sp *channelSpool) used() int64 { return sp.ownCost.Load() + sp.otherCost.Load() }

// markFull writes spoolFullMark (a failure is logged: the refusal
// stands, status only misses it).
func (sp *channelSpool) markFull(bound int64) {
	raw, _ := json.Marshal(spoolFull{BoundBytes: bound, Since: time.Now().UTC()})
	if _, err := atomicfile.Create(filepath.Join(sp.dir, spoolFullMark), raw, 0o600); err != nil {
		sp.log.Warn("channel spool: its at-the-bound mark not written", zap.Error(err))
	}
	sp.log.Warn("channel spool at its bound: new messages refused (503) until delivery brings it below",
		zap.Int64("bound_bytes", bound), zap.Int64("kept_bytes", sp.used()))
}

// unmarkFull removes spoolFullMark.
func (sp *channelSpool) unmarkFull() {
	if err := os.Remove(filepath.Join(sp.dir, spoolFullMark)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		sp.log.Warn("channel spool: its at-the-bound mark not removed", zap.Error(err))
	}
}

// settle looks again at the other owners' folders and, at a spool that
// refused for bound, whether the refused message would fit now: drained
// below the bound without a new message, status said it was at its bound
// for good. The mark is the plugin's, shared by its replicas: one not at
// the bound removes it and one at the bound writes it back, so that with
// replicas that disagree near the bound it shows what the last look saw.
func (sp *channelSpool) settle(bound int64) {
	if sp == nil {
		return
	}
	sp.lockBound()
	sp.otherCost.Store(sp.othersNow(true))
	sp.unlockBound()
	if sp.full.Load() && sp.used()+sp.refused.Load() <= bound {
		sp.full.Store(false)
	}
	if !sp.full.Load() {
		sp.unmarkFull()
		return
	}
	if _, err := os.Lstat(filepath.Join(sp.dir, spoolFullMark)); errors.Is(err, fs.ErrNotExist) {
		sp.markFull(bound)
	}
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
		fi, err := os.Lstat(f)
		if err != nil {
			continue // gone: it was counted out when it went
		}
		if err := os.Remove(f); err != nil {
			// Kept, it is delivered again once this process is gone.
			sp.log.Warn("channel spool: a delivered message's file not removed", zap.Error(err))
			continue
		}
		sp.release(spoolCost(fi.Size()))
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
	// The old layout's owners first: accepted before the upgrade, so
	// before anything of this layout.
	var dead []string
	if others, err := os.ReadDir(sp.alias); err == nil {
		for _, o := range others {
			if o.IsDir() && !strings.HasPrefix(o.Name(), spoolPluginPrefix) {
				dead = append(dead, filepath.Join(sp.alias, o.Name()))
			}
		}
	}
	for _, o := range owners {
		// IsDir is the entry's own type: a symlink is never followed.
		if path := filepath.Join(sp.dir, o.Name()); o.IsDir() && path != sp.own {
			dead = append(dead, path)
		}
	}
	n := 0
	for _, path := range dead {
		got, full := sp.adoptFrom(path, q)
		n += got
		if full {
			break
		}
	}
	if !sp.strayed.Load() {
		sp.strays()
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
	f, err := os.OpenFile(filepath.Join(dead, spoolLock), os.O_RDWR|unix.O_NOFOLLOW, 0)
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
	refused := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, spoolExt) || strings.HasPrefix(name, ".") {
			continue
		}
		if !e.Type().IsRegular() {
			// Never written by a spool: not followed, and removed
			// (the link, not what it names) so that the folder goes.
			refused++
			_ = os.Remove(filepath.Join(dead, name))
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	left := len(names)
	for _, name := range names {
		from := filepath.Join(dead, name)
		raw, err := readKept(from)
		if errors.Is(err, errNotKept) {
			refused++
			_ = os.Remove(from)
			left--
			continue
		}
		if err != nil {
			sp.log.Warn("channel spool: a dead replica's message not read", zap.Error(err))
			continue
		}
		// The sequence is the adopter's; the rest (the host id) stays.
		rest := spoolExt
		if len(name) > spoolSeqLen {
			rest = name[spoolSeqLen:]
		}
		to := filepath.Join(sp.own, fmt.Sprintf("%0*d%s", spoolSeqLen, sp.seq.Add(1), rest))
		cost := spoolCost(int64(len(raw)))
		if err := sp.moveIn(cost, from, to); err != nil {
			sp.log.Warn("channel spool: a dead replica's message not taken over", zap.Error(err))
			continue
		}
		if err := q.PushTagged(json.RawMessage(raw), to); err != nil {
			if errors.Is(err, wasmhost.ErrInboundFull) {
				sp.moveBack(cost, to, from)
				return n, true
			}
			// Not a JSON object: the listener never queued such.
			sp.log.Warn("channel spool: a dead replica's message dropped", zap.Error(err))
			sp.drop(to)
		}
		left--
		n++
	}
	if refused > 0 {
		sp.log.Warn("channel spool: kept messages not delivered: not regular files, or larger than a message may be; removed",
			zap.Int("messages", refused), zap.String("folder", dead))
	}
	if left == 0 {
		// Under the lock: an adopter that opens the lock after this
		// finds none and leaves the folder alone.
		_ = os.Remove(filepath.Join(dead, spoolLock))
		_ = os.RemoveAll(dead)
	}
	return n, false
}

// errNotKept is a spool entry no spool wrote: not a regular file, or
// larger than a message may be.
var errNotKept = errors.New("not a kept message")

// readKept reads the kept message in file path, never through a symlink
// and at most maxInboundBody bytes.
func readKept(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s: %w", path, errNotKept)
	}
	if err != nil {
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxInboundBody {
		return nil, fmt.Errorf("%s: %w", path, errNotKept)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxInboundBody+1))
	if err != nil {
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	if len(raw) > maxInboundBody {
		return nil, fmt.Errorf("%s: %w", path, errNotKept)
	}
	return raw, nil
}

// strays logs, once, the messages kept under the spool's alias for
// another plugin (the alias was bound to it when they were accepted).
// They stay on disk, for a binding of their plugin under the alias,
// whose spool adopts them; the operator may remove them.
func (sp *channelSpool) strays() {
	others, err := os.ReadDir(sp.alias)
	if err != nil {
		return
	}
	n := 0
	var where []string
	for _, o := range others {
		path := filepath.Join(sp.alias, o.Name())
		if !o.IsDir() || path == sp.dir || !strings.HasPrefix(o.Name(), spoolPluginPrefix) {
			continue // the old layout's owners are adopted
		}
		got := 0
		owners, _ := os.ReadDir(path)
		for _, ow := range owners {
			if ow.IsDir() {
				got += countKept(filepath.Join(path, ow.Name()))
			}
		}
		if got > 0 {
			n += got
			where = append(where, path)
		}
	}
	sp.strayed.Store(true)
	if n > 0 {
		sp.log.Warn("channel spool: messages accepted for another plugin of this alias are not delivered by this one; a binding of their plugin under this alias delivers them, or remove them",
			zap.Int("messages", n), zap.Strings("folders", where))
	}
}

// countKept is the number of kept messages in folder dir.
func countKept(dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), spoolExt) {
			n++
		}
	}
	return n
}

// hostIDOf is the host id kept in the name of file (write), or "" for a
// file of an older release, which kept none.
func hostIDOf(file string) string {
	name := strings.TrimSuffix(filepath.Base(file), spoolExt)
	if len(name) <= spoolSeqLen+1 || name[spoolSeqLen] != '-' {
		return ""
	}
	id := name[spoolSeqLen+1:]
	if !validHostID(id) {
		return ""
	}
	return id
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
	if sp.full.Load() {
		// No binding refuses anything here any more; the next one
		// counts afresh.
		sp.unmarkFull()
	}
	// The ledger let go, what own still holds is counted by its files.
	sp.ledger.Close()
	sp.dirLock.Close()
	sp.lock.Close()
}

// spool returns the spool of alias bound to plugin, opened at its first
// such binding in this process; nil without Config.ChannelSpoolDir.
func (s *Server) spool(alias, plugin string) (*channelSpool, error) {
	if s.cfg.ChannelSpoolDir == "" {
		return nil, nil
	}
	s.spoolMu.Lock()
	defer s.spoolMu.Unlock()
	key := spoolKey{alias, plugin}
	if sp := s.spools[key]; sp != nil {
		return sp, nil
	}
	sp, err := openSpool(s.cfg.ChannelSpoolDir, alias, plugin, s.logger.With(zap.String("channel", alias), zap.String("plugin", plugin)))
	if err != nil {
		return nil, err
	}
	if s.spools == nil {
		s.spools = map[spoolKey]*channelSpool{}
	}
	s.spools[key] = sp
	return sp, nil
}

// spoolKey names a spool: the alias, and the plugin it is bound to.
type spoolKey struct{ alias, plugin string }

// closeSpools closes every spool; the bindings have stopped.
func (s *Server) closeSpools() {
	s.spoolMu.Lock()
	defer s.spoolMu.Unlock()
	for key, sp := range s.spools {
		sp.close()
		delete(s.spools, key)
	}
}

// closeSpoolsBut closes every spool whose key is not in inUse: the
// bindings that used it have stopped (each binding's stop waits for its
// listener and deliveries), so none writes to it any more. What its
// folder still holds (notices the stop's grace cut) is adopted by the
// next binding of its alias and plugin, as after the process's stop.
func (s *Server) closeSpoolsBut(inUse map[spoolKey]bool) {
	s.spoolMu.Lock()
	defer s.spoolMu.Unlock()
	for key, sp := range s.spools {
		if !inUse[key] {
			sp.close()
			delete(s.spools, key)
		}
	}
}
