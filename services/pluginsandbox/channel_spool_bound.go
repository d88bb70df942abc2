package pluginsandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
//     files, scanned at first sight and then at each look, since a dead
//     owner never takes more (an adopter moves its files out, reserving
//     each before the move, so the count is over, never under, until the
//     next look). A running replica of the release before is counted as
//     before, as of the last look: an upgrade's overlap only.
//
// The ledger is never synced: it is read only while its owner lives
// (the page cache is shared); once the owner is gone, its files count.
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
// files only, never through a link).
func ownerFiles(path string) int64 {
	msgs, err := os.ReadDir(path)
	if err != nil {
		return 0
	}
	var n int64
	for _, m := range msgs {
		if !m.Type().IsRegular() || !strings.HasSuffix(m.Name(), spoolExt) {
			continue
		}
		if fi, err := m.Info(); err == nil {
			n += spoolCost(fi.Size())
		}
	}
	return n
}

// ownerScan is an owner folder counted by its files: its ledger's inode
// (0: it had none) and the cost.
type ownerScan struct {
	ino  uint64
	cost int64
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
// ones' ledgers as they are, the others' files as last scanned. Called
// under lockBound; rescan scans the latter again (the look).
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
		c, ok := sp.scans[o.Name()]
		if !ok || c.ino != ino || rescan {
			c = ownerScan{ino, ownerFiles(path)}
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

// take counts cost in ownCost whatever the bound: a dead owner's message
// about to be moved into this folder (counted in its folder until then,
// so counted twice until the others' next look, never missed). An error
// is the ledger not written: nothing taken, the message stays.
func (sp *channelSpool) take(cost int64) error {
	sp.lockBound()
	defer sp.unlockBound()
	return sp.grow(cost)
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
// written. A ledger not written is logged: the others count more than
// there is (refusing early) until it is written again.
func (sp *channelSpool) release(cost int64) {
	sp.lockBound()
	defer sp.unlockBound()
	if err := writeLedger(sp.ledger, sp.ownCost.Add(-cost)); err != nil {
		sp.log.Warn("channel spool: its count not written for the other replicas", zap.Error(err))
	}
}
