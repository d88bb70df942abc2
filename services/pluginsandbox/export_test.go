package pluginsandbox

import (
	"os"
	"sync"
	"time"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

// SetRestoreHook has hook called before a memory restore stores its i-th
// entry, until the returned func puts the hook back.
func SetRestoreHook(hook func(i int)) (undo func()) {
	old := restoreHook
	restoreHook = hook
	return func() { restoreHook = old }
}

// SetListBudget sets the bound of a listing's answer until the returned
// func puts it back.
func SetListBudget(n int) (undo func()) {
	old := listBudget
	listBudget = n
	return func() { listBudget = old }
}

// CountManifestParses counts the manifests discovery's fingerprint parses,
// until the returned undo puts the parser back.
func CountManifestParses() (count func() int, undo func()) {
	old := parseManifest
	var mu sync.Mutex
	n := 0
	parseManifest = func(data []byte) (*manifest.Manifest, error) {
		mu.Lock()
		n++
		mu.Unlock()
		return old(data)
	}
	count = func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
	return count, func() { parseManifest = old }
}

// SetChannelConnections sets how many connections a channel listener
// serves at once until the returned func puts it back.
func SetChannelConnections(n int) (undo func()) {
	old := maxInboundConns
	maxInboundConns = n
	return func() { maxInboundConns = old }
}

// SetMemoryJournal gives the journal of the memory plugin named plugin a
// bound and a maker of a rewrite's new file.
func SetMemoryJournal(s *Server, plugin string, limit int64, createTemp func(dir, pattern string) (*os.File, error)) {
	j := s.current().memories[plugin].ledger.journal
	j.limit, j.createTemp = limit, createTemp
}

// SetChannelConversations sets how many conversations a channel delivers
// at once until the returned func puts it back.
func SetChannelConversations(n int) (undo func()) {
	old := maxConversations
	maxConversations = n
	return func() { maxConversations = old }
}

// ChannelPending is the number of messages the channel alias polled and
// has not yet delivered (0 for an alias not bound).
func ChannelPending(s *Server, alias string) int {
	if l := s.channels.listed.Load(); l != nil {
		for _, b := range *l {
			if b.cfg.Alias == alias && b.dl != nil {
				return b.dl.pending()
			}
		}
	}
	return 0
}

// SetLoadHook has hook called in a load between the manifest's read and
// the reads of the files it names, until the returned func puts it back.
func SetLoadHook(hook func(path string)) (undo func()) {
	old := loadHook
	loadHook = hook
	return func() { loadHook = old }
}

// CountFingerprintStats counts the files discovery's fingerprint looks
// at, until the returned undo puts os.Lstat back.
func CountFingerprintStats() (count func() int, undo func()) {
	old := lstat
	var mu sync.Mutex
	n := 0
	lstat = func(name string) (os.FileInfo, error) {
		mu.Lock()
		n++
		mu.Unlock()
		return old(name)
	}
	count = func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
	return count, func() { lstat = old }
}

// SetToolLookupHook has hook called in ExecuteTool between the tool's
// lookup and the call reference taken on its plugin, until the returned
// func puts it back.
func SetToolLookupHook(hook func(tool string)) (undo func()) {
	old := toolLookupHook
	toolLookupHook = hook
	return func() { toolLookupHook = old }
}

// SetMemoryCallHook has hook called in a memory call once the replica
// has caught up on the journal, before the call's own work, until the
// returned func puts it back.
func SetMemoryCallHook(hook func()) (undo func()) {
	old := memoryCallHook
	memoryCallHook = hook
	return func() { memoryCallHook = old }
}

// WrongTokenGap is wrongTokenGap, the least time between two reads of a
// channel's token that tokens other than the one last read begin.
var WrongTokenGap = wrongTokenGap

// SetWrongTokenGap sets wrongTokenGap and has hook called as a request
// begins to wait for it, until the returned func puts both back.
func SetWrongTokenGap(gap time.Duration, hook func()) (undo func()) {
	oldGap, oldHook := wrongTokenGap, tokenWaitHook
	wrongTokenGap, tokenWaitHook = gap, hook
	return func() { wrongTokenGap, tokenWaitHook = oldGap, oldHook }
}

// SetStallHooks sets the hooks of a channel's failure on a message its
// plugin's service holds (admitHook, failingHook, failedHook; nil: none)
// until the returned func puts them back. Set before the server starts,
// undone after it closed.
func SetStallHooks(admit, failing func(), failed func(queued int)) (undo func()) {
	oa, ofg, ofd := admitHook, failingHook, failedHook
	admitHook, failingHook, failedHook = admit, failing, failed
	return func() { admitHook, failingHook, failedHook = oa, ofg, ofd }
}

// SetRefusalHook has hook called as a binding's poller begins to handle a
// polled message the host refused for its size, with the number of
// queued messages the plugin read for it, until the returned func puts
// it back. Set before the servers start, undone after they closed.
func SetRefusalHook(hook func(read int)) (undo func()) {
	old := refusingHook
	refusingHook = hook
	return func() { refusingHook = old }
}

// SetStalledPollHook has hook called each time the poller of a binding
// failed on a message its plugin's service holds sets the wait before
// its next poll (at the failure, and after each poll while it stays
// failed), until the returned func puts it back. Set before the server
// starts, undone after it closed.
func SetStalledPollHook(hook func(wait time.Duration)) (undo func()) {
	old := stalledPollHook
	stalledPollHook = hook
	return func() { stalledPollHook = old }
}

// SetStalledPollBound sets the bound of a failed binding's wait between
// polls until the returned func puts it back.
func SetStalledPollBound(d time.Duration) (undo func()) {
	old := stalledPollMax
	stalledPollMax = d
	return func() { stalledPollMax = old }
}
