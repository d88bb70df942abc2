package pluginsandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The spool's bound across processes (channel_spool.go's "Disk bound").
//
// The replicas of a plugin's sandbox share its spool folder, and each
// counted the others' owner folders as of its last look (at open, then
// every adoptEvery): two replicas near the bound each took what the
// other's stale count left room for, and the disk held up to the bound
// once per replica. Now the check and the reservation are one step over
// every process:
//
//   - each owner keeps its count (ownCost, which counts a message from
//     before its file is written until after it is removed) in a ledger
//     file of its folder, spoolLedger, flocked by the owner for as long
//     as it lives;
//   - a message is reserved under an flock of the plugin's folder itself
//     (not a file in it: clawmesh spool drop removes the folder once it is
//     empty, and a lock file removed while held would let the next
//     replica lock another one), after reading every live owner's ledger;
//   - an owner whose ledger is not held is dead (or opening, with none
//     yet, or of a release before ledgers): its folder is counted by its
//     files, scanned at first sight and again at a step once the folder
//     changed (its change time, othersNow), up to spoolRescanMax files.
//     A dead owner never takes more, and an adopter moves each file out
//     in one locked step with its own count (moveIn), so the others
//     count it once, right after the move as before it. A running
//     replica of the release before (no ledger) is counted by its files
//     as they are at the step, though it counts the others as of its
//     own last look: an upgrade's overlap only.
//
// The ledger is never synced: it is read only while its owner lives
// (the page cache is shared); once the owner is gone, its files count.
// A crash of the machine leaves every owner gone, so no count written
// before it is read after it: neither its order against the message's
// fsync nor a write the crash cut matters. It is written in place (one
// pwrite of its 20 bytes, never truncated) under the plugin folder's
// lock, which its readers hold too, so none reads it half written. That
// is all the locked step writes: BenchmarkChannelSpoolReserve (both
// steps of a message, three other owners) is under a tenth of a
// millisecond at load 15, where a message's fsync is milliseconds.
//
// The reading costs a directory listing and four system calls a live
// owner, under a lock held for microseconds: the file is written (and
// synced) after the lock is let go, as the process's own compare-and-swap
// let concurrent writes sync at once.

// spoolLedger, in an owner's folder, holds its count: spoolLedgerLen
// decimal digits, overwritten in place.
const spoolLedger = "kept"

const spoolLedgerLen = 20

// openLedger makes the ledger of owner folder own, locked, holding 0.
// Made under another name and renamed once locked: a ledger that is seen
// is held by its owner until it dies.
func openLedger(own string) (*os.File, error) {
	tmp := filepath.Join(own, "."+spoolLedger)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("channel spool: lock its count: %w", err)
	}
	if err := writeLedger(f, 0); err != nil {
		f.Close()
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(own, spoolLedger)); err != nil {
		f.Close()
		return nil, fmt.Errorf("channel spool: %w", err)
	}
	return f, nil
}

// writeLedger overwrites f's count with n.
func writeLedger(f *os.File, n int64) error {
	var b [spoolLedgerLen]byte
	s := strconv.FormatInt(n, 10)
	copy(b[:], strings.Repeat("0", spoolLedgerLen-len(s))+s)
	if _, err := f.WriteAt(b[:], 0); err != nil {
		return fmt.Errorf("channel spool: write its count: %w", err)
	}
	return nil
}

// readLedger reads the ledger of owner folder path. live is its owner
// holding it; ino names the ledger (0: none), so that a folder counted
// by its files is scanned again if its ledger changed.
func readLedger(path string) (live bool, n int64, ino uint64) {
	f, err := os.OpenFile(filepath.Join(path, spoolLedger), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, 0, 0
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, 0, 0
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		return false, 0, st.Ino // let go at the close: dead
	} else if !errors.Is(err, unix.EWOULDBLOCK) {
		return false, 0, 0
	}
	var b [spoolLedgerLen]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return false, 0, 0
	}
	n, err = strconv.ParseInt(string(b[:]), 10, 64)
	if err != nil || n < 0 {
		return false, 0, 0 // not a ledger of ours: counted by the files
	}
	return true, n, st.Ino
}

// ownerFiles is the cost of the messages in owner folder path (regular
// files only, never through a link), and how many there are.
func ownerFiles(path string) (cost int64, files int) {
	msgs, err := os.ReadDir(path)
	if err != nil {
		return 0, 0
	}
	for _, m := range msgs {
		if !m.Type().IsRegular() || !strings.HasSuffix(m.Name(), spoolExt) {
			continue
		}
		if fi, err := m.Info(); err == nil {
			cost += spoolCost(fi.Size())
			files++
		}
	}
	return cost, files
}

// ownerScan is an owner folder counted by its files: its ledger's inode
// (0: it had none), the folder's change time (ns) and when it was
// scanned (ns, the wall clock), the cost and the number of files.
type ownerScan struct {
	ino              uint64
	changed, scanned int64
	cost             int64
	files            int
}

// spoolRescanMax bounds the scan a locked step may make of a folder
// counted by its files: one that held more at its last scan is counted
// again only at the look (settle), as every such folder was before.
// A scan costs about a microsecond a file on a quiet machine (an lstat
// each), ten at load 30 (BenchmarkChannelSpoolCountByFiles): 1,024
// files is a few milliseconds under the lock at worst, and 4 MiB of the
// smallest messages.
const spoolRescanMax = 1024

// spoolRacy is how long after a folder's change a scan of it may have
// missed a later one with the same change time: a file system stamps a
// change with its clock's tick, not the instant. A folder scanned within
// that of its change is scanned again at the next step, as git does
// with an index entry as new as the index. Linux's local file systems
// stamp to the nanosecond with the coarse clock, which moves once a
// jiffy (10 ms at HZ=100, the slowest): spoolRacyFine. One that stamps
// whole seconds (ext3, FAT: two) is told by a change time with no
// fraction: spoolRacy. The fine one is what keeps the step cheap: a
// folder is scanned at every step for 20 ms after its change, where
// 2 s of them made BenchmarkChannelSpoolReserve twice as slow.
const (
	spoolRacy     = 2 * time.Second
	spoolRacyFine = 20 * time.Millisecond
)

// changedAt is the change time (ns) of folder path, and false if it is
// gone. A folder's change time moves with every name made, removed or
// renamed in it (POSIX requires it of link, unlink and rename) and,
// unlike its modification time, cannot be set back.
func changedAt(path string) (int64, bool) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, false
	}
	return st.Ctim.Nano(), true
}

// stale is whether the folder the scan counted may hold other files now
// that it last changed at changed.
func (c ownerScan) stale(changed int64) bool {
	if c.files > spoolRescanMax {
		return false // bounded: counted again at the look
	}
	racy := spoolRacy
	if c.changed%int64(time.Second) != 0 {
		racy = spoolRacyFine
	}
	return changed != c.changed || c.changed+racy.Nanoseconds() > c.scanned
}

// lockBound takes the lock the check and the reservation are made under:
// the process's (its spools' writers) and the plugin folder's (the other
// processes').
func (sp *channelSpool) lockBound() {
	sp.boundMu.Lock()
	// Blocking: holders hold it for a reading of a few ledgers. An
	// error (the descriptor is the spool's own) leaves this process's
	// lock alone; counted, not ordered, across processes then.
	_ = unix.Flock(int(sp.dirLock.Fd()), unix.LOCK_EX)
}

func (sp *channelSpool) unlockBound() {
	_ = unix.Flock(int(sp.dirLock.Fd()), unix.LOCK_UN)
	sp.boundMu.Unlock()
}

// othersNow is what the other owner folders of the plugin hold: the live
// ones' ledgers as they are, the others' files as scanned. Called under
// lockBound. A folder counted by its files is scanned at first sight,
// then again once it changed (an adopter moved files out of a dead
// owner's, under lockBound too; a running replica of the release before
// the ledgers, which keeps none, took or delivered one), up to
// spoolRescanMax files; rescan scans every one again (the look).
func (sp *channelSpool) othersNow(rescan bool) int64 {
	owners, err := os.ReadDir(sp.dir)
	if err != nil {
		return sp.otherCost.Load() // as last counted
	}
	var n int64
	seen := make(map[string]ownerScan, len(owners))
	for _, o := range owners {
		path := filepath.Join(sp.dir, o.Name())
		if !o.IsDir() || path == sp.own {
			continue
		}
		live, cost, ino := readLedger(path)
		if live {
			n += cost
			continue
		}
		changed, ok := changedAt(path)
		if !ok {
			continue // gone since the listing: an adopter removed it
		}
		c, ok := sp.scans[o.Name()]
		if !ok || c.ino != ino || rescan || c.stale(changed) {
			// The time first: a change during the scan is seen as
			// one after it.
			c = ownerScan{ino: ino, changed: changed, scanned: time.Now().UnixNano()}
			c.cost, c.files = ownerFiles(path)
		}
		seen[o.Name()] = c
		n += c.cost
	}
	// Bounded by the folders there are.
	sp.scans = seen
	return n
}

// reserve counts cost in ownCost, and in the ledger, if the plugin's
// spool stays within bound with it, every owner counted as it is. An
// error is the ledger not written: nothing reserved.
func (sp *channelSpool) reserve(cost, bound int64) (bool, error) {
	sp.lockBound()
	defer sp.unlockBound()
	others := sp.othersNow(false)
	sp.otherCost.Store(others)
	if sp.ownCost.Load()+others+cost > bound {
		return false, nil
	}
	return true, sp.grow(cost)
}

// moveIn counts cost in ownCost whatever the bound and moves a dead
// owner's message from to this folder's to, in one locked step: the
// others count it in one folder or the other, never both (the dead one
// is scanned again once changed, othersNow) and never neither. Counted
// and moved apart, it was counted twice until the others' next look
// (5 s), and they refused messages the bound had room for. An error is
// the ledger not written or the file not moved: nothing taken, the
// message stays.
func (sp *channelSpool) moveIn(cost int64, from, to string) error {
	sp.lockBound()
	defer sp.unlockBound()
	if err := sp.grow(cost); err != nil {
		return err
	}
	if err := os.Rename(from, to); err != nil {
		sp.shrink(cost)
		return fmt.Errorf("channel spool: %w", err)
	}
	return nil
}

// moveBack undoes moveIn (the queue had no room for the message), in one
// locked step. A file not moved back stays this owner's, counted, and is
// delivered after a restart.
func (sp *channelSpool) moveBack(cost int64, to, from string) {
	sp.lockBound()
	defer sp.unlockBound()
	if os.Rename(to, from) == nil {
		sp.shrink(cost)
	}
}

// grow adds cost to ownCost and the ledger, or neither. Under lockBound.
func (sp *channelSpool) grow(cost int64) error {
	if err := writeLedger(sp.ledger, sp.ownCost.Load()+cost); err != nil {
		// Read by the others as it was: the message must not be
		// written, or they would count it out.
		_ = writeLedger(sp.ledger, sp.ownCost.Load())
		return err
	}
	sp.ownCost.Add(cost)
	return nil
}

// release counts cost out of ownCost: its file is gone, or was never
// written.
func (sp *channelSpool) release(cost int64) {
	sp.lockBound()
	defer sp.unlockBound()
	sp.shrink(cost)
}

// shrink counts cost out of ownCost and the ledger. Under lockBound. A
// ledger not written is logged: the others count more than there is
// (refusing early) until it is written again.
func (sp *channelSpool) shrink(cost int64) {
	if err := writeLedger(sp.ledger, sp.ownCost.Add(-cost)); err != nil {
		sp.log.Warn("channel spool: its count not written for the other replicas", zap.Error(err))
	}
}
