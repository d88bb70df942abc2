package pluginsandbox

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
)

// spoolHeldMark, in a plugin's folder under an alias, names the last
// polled message the host refused for its size whose sender was told
// (spoolHeld), for as long as the plugin answers nothing else. The
// binding's own memory of it (heldKey, pollRefusals.last) is the
// process's: a restarted sandbox, or another replica of the alias
// polling the same plugin's service, met the message as a new refusal
// and told its sender again. The folder is the one the replicas share,
// so each reads what any of them told.
const spoolHeldMark = "held"

// spoolHeldVersion is spoolHeld's version; a mark of another version is
// not read (its sender may be told again, never a message skipped).
const spoolHeldVersion = 1

// spoolHeldMax bounds the mark's read: it holds a digest and a time.
const spoolHeldMax = 4 << 10

// spoolHeld is spoolHeldMark's content.
type spoolHeld struct {
	Version int `json:"version"`
	// Key is the message's refusalKey, a digest: the fields it is
	// made of (sender, thread) stay out of the operator's folders.
	Key   string    `json:"key"`
	Since time.Time `json:"since"`
}

// markHeld records key as the refused message whose sender was told, in
// place of any mark before it (a newer refusal's: Create kept the first
// mark a folder had for good, so a process meeting a later message read
// an older key and told its sender again). Written whole and synced. A
// failure is logged: the refusal stands, and only a process after this
// one may tell its sender again.
func (sp *channelSpool) markHeld(key string) {
	if sp == nil {
		return
	}
	raw, _ := json.Marshal(spoolHeld{Version: spoolHeldVersion, Key: key, Since: time.Now().UTC()})
	if err := atomicfile.Replace(filepath.Join(sp.dir, spoolHeldMark), raw, 0o600); err != nil {
		sp.log.Warn("channel spool: the refused message's mark not written", zap.Error(err))
	}
}

// claimHeld is whether this process tells the sender of the refused
// message key; if so, it marked it first (markHeld), so that the mark is
// on disk before the sender is told. The check and the mark are one step
// under the plugin folder's flock (lockBound), which every replica of
// the alias sharing the spool takes: two of them meeting the message at
// once (one read it from its queue, and its plugin handed it to the
// plugin's service; the other polled that service before the first had
// marked it) both found no mark and both told the sender. Now the second
// to take the lock finds the first's mark.
//
// A message the plugin read from the queue for this poll (fresh) is a
// new refusal unless the mark was written since the poll began (polled):
// another replica met it in the service during the poll and told its
// sender. A mark of the same digest from before the poll is an earlier
// message's (a sender who sent the same message again), whose sender is
// told again. One met with no read, from the plugin's service, was told
// by whoever marked it, at any time. Without a spool (no shared folder)
// it is told.
func (sp *channelSpool) claimHeld(key string, fresh bool, polled time.Time) bool {
	if sp == nil {
		return true
	}
	sp.lockBound()
	defer sp.unlockBound()
	if h, ok := sp.readHeld(); ok && h.Key == key && (!fresh || !h.Since.Before(polled)) {
		return false
	}
	sp.markHeld(key)
	return true
}

// heldMark is the key spoolHeldMark names, "" without one (none, not a
// regular file, too long, not of this version).
func (sp *channelSpool) heldMark() string {
	if sp == nil {
		return ""
	}
	h, _ := sp.readHeld()
	return h.Key
}

// readHeld reads spoolHeldMark; false without one (none, not a regular
// file, too long, not of this version).
func (sp *channelSpool) readHeld() (spoolHeld, bool) {
	f, err := os.OpenFile(filepath.Join(sp.dir, spoolHeldMark), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return spoolHeld{}, false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return spoolHeld{}, false
	}
	raw, err := io.ReadAll(io.LimitReader(f, spoolHeldMax+1))
	if err != nil || len(raw) > spoolHeldMax {
		return spoolHeld{}, false
	}
	var h spoolHeld
	if json.Unmarshal(raw, &h) != nil || h.Version != spoolHeldVersion || h.Key == "" {
		return spoolHeld{}, false
	}
	return h, true
}

// unmarkHeld removes spoolHeldMark if it names key: the plugin answered
// something else. One naming another key is another refusal's, newer.
// Under the plugin folder's lock, as claimHeld marks: a mark another
// replica writes between the read and the remove is not taken with it.
func (sp *channelSpool) unmarkHeld(key string) {
	if sp == nil {
		return
	}
	sp.lockBound()
	defer sp.unlockBound()
	if sp.heldMark() != key {
		return
	}
	if err := os.Remove(filepath.Join(sp.dir, spoolHeldMark)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		sp.log.Warn("channel spool: the refused message's mark not removed", zap.Error(err))
	}
}
