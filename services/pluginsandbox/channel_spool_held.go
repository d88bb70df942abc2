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

// markHeld records key as the refused message whose sender was told. A
// failure is logged: the refusal stands, and only a process after this
// one may tell its sender again.
func (sp *channelSpool) markHeld(key string) {
	if sp == nil {
		return
	}
	raw, _ := json.Marshal(spoolHeld{Version: spoolHeldVersion, Key: key, Since: time.Now().UTC()})
	if _, err := atomicfile.Create(filepath.Join(sp.dir, spoolHeldMark), raw, 0o600); err != nil {
		sp.log.Warn("channel spool: the refused message's mark not written", zap.Error(err))
	}
}

// heldMark is the key spoolHeldMark names, "" without one (none, not a
// regular file, too long, not of this version).
func (sp *channelSpool) heldMark() string {
	if sp == nil {
		return ""
	}
	f, err := os.OpenFile(filepath.Join(sp.dir, spoolHeldMark), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return ""
	}
	raw, err := io.ReadAll(io.LimitReader(f, spoolHeldMax+1))
	if err != nil || len(raw) > spoolHeldMax {
		return ""
	}
	var h spoolHeld
	if json.Unmarshal(raw, &h) != nil || h.Version != spoolHeldVersion {
		return ""
	}
	return h.Key
}

// unmarkHeld removes spoolHeldMark if it names key: the plugin answered
// something else. One naming another key is another refusal's, newer.
func (sp *channelSpool) unmarkHeld(key string) {
	if sp == nil || sp.heldMark() != key {
		return
	}
	if err := os.Remove(filepath.Join(sp.dir, spoolHeldMark)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		sp.log.Warn("channel spool: the refused message's mark not removed", zap.Error(err))
	}
}
