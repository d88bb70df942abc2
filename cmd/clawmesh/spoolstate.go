package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/datadir"
)

// The channel spool (services/pluginsandbox/channel_spool.go) keeps each
// message a sandbox answered 202 for until it is done with. What it could
// not deliver (a binding moved to another plugin, a plugin never loaded
// again, a replica that died) waited there, said only in the sandbox's
// log. Status counts it per alias and plugin, with the oldest message's
// age, read from the data directory as a scan of names and types: never
// through a symbolic link (os.ReadDir's types are the links' own, and a
// message's age is its Lstat), and bounded.

// maxSpoolScan bounds the entries status looks at in the spool.
const maxSpoolScan = 100_000

// oldLayoutPlugin stands for the plugin of a folder of the layout
// before the plugin was part of it, which names none.
const oldLayoutPlugin = "(no plugin named: an earlier release's)"

// spoolWait is the kept messages of one alias bound to one plugin.
type spoolWait struct {
	alias, plugin string
	messages      int
	bytes         int64
	oldest        time.Time
	// atBound is the bound (bytes) of a spool that refuses new messages
	// for it since fullSince (the sandbox's mark, spoolFullMark); 0
	// for one that takes them.
	atBound   int64
	fullSince time.Time
}

// spoolFullMark is the file a sandbox keeps in a plugin's folder while
// the spool refuses new messages for its bound (channels.plugin.<alias>.
// spool_max_mb; services/pluginsandbox/channel_spool.go): status cannot
// tell it from the bytes, which count each message in whole blocks and
// every replica together, and the bound is a setting of the config
// service, which spool list runs without.
const spoolFullMark = "full"

// spoolHeldMark is the file a sandbox keeps in a plugin's folder naming
// (by a digest) a polled message refused for its size whose sender was
// told, while the plugin's own service holds it (services/pluginsandbox/
// channel_spool_held.go); drop removes it with the plugin's messages.
const spoolHeldMark = "held"

// maxFullMark bounds the mark's read.
const maxFullMark = 1024

// readFullMark reads plugin folder dir's mark, never through a link;
// ok is false without one.
func readFullMark(dir string) (bound int64, since time.Time, ok bool) {
	f, err := os.OpenFile(filepath.Join(dir, spoolFullMark), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, time.Time{}, false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return 0, time.Time{}, false
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxFullMark))
	var m struct {
		BoundBytes int64     `json:"bound_bytes"`
		Since      time.Time `json:"since"`
	}
	if err != nil || json.Unmarshal(raw, &m) != nil || m.BoundBytes <= 0 {
		return 0, time.Time{}, false
	}
	return m.BoundBytes, m.Since, true
}

// spoolWaiting scans the spool of the data directory dir. truncated is
// set when it stopped at maxSpoolScan entries.
func spoolWaiting(dir string) (waits []spoolWait, truncated bool) {
	root := datadir.ChannelSpool(dir)
	if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
		return nil, false
	}
	seen := 0
	// list is the folders under path (never a link's target).
	list := func(path string) []os.DirEntry {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil
		}
		if seen += len(ents); seen > maxSpoolScan {
			truncated = true
			return nil
		}
		return ents
	}
	for _, a := range list(root) {
		alias, err := hex.DecodeString(a.Name())
		if !a.IsDir() || err != nil {
			continue
		}
		for _, p := range list(filepath.Join(root, a.Name())) {
			if !p.IsDir() {
				continue
			}
			// The old layout (<alias>/<owner>/) names no plugin.
			plugin, owners := oldLayoutPlugin, []os.DirEntry{p}
			base := filepath.Join(root, a.Name())
			if name, ok := strings.CutPrefix(p.Name(), "p-"); ok {
				raw, err := hex.DecodeString(name)
				if err != nil {
					continue
				}
				plugin, base = string(raw), filepath.Join(base, p.Name())
				owners = list(base)
			}
			w := spoolWait{alias: string(alias), plugin: plugin}
			if plugin != oldLayoutPlugin {
				if bound, since, ok := readFullMark(base); ok {
					w.atBound, w.fullSince = bound, since
				}
			}
			for _, o := range owners {
				if !o.IsDir() {
					continue
				}
				for _, m := range list(filepath.Join(base, o.Name())) {
					if !m.Type().IsRegular() || !strings.HasSuffix(m.Name(), ".msg") {
						continue
					}
					fi, err := m.Info()
					if err != nil {
						continue
					}
					w.messages++
					w.bytes += fi.Size()
					if w.oldest.IsZero() || fi.ModTime().Before(w.oldest) {
						w.oldest = fi.ModTime()
					}
				}
			}
			if w.messages > 0 {
				waits = append(waits, w)
			}
		}
	}
	sort.Slice(waits, func(i, j int) bool {
		if waits[i].alias != waits[j].alias {
			return waits[i].alias < waits[j].alias
		}
		return waits[i].plugin < waits[j].plugin
	})
	return waits, truncated
}

// Retention. Each kept message was answered 202, which promises it is
// delivered or its sender told; a spool that dropped what waits past an
// age or a size would break that promise without a word to the sender.
// So nothing is dropped by itself: past spoolWarnAge or spoolWarnBytes
// status says the messages wait for a plugin nobody binds, and how to
// deliver them (bind it again) or drop them (clawmesh spool drop, the
// operator's decision, logged by what it prints). Growth is bounded per
// event anyway: a replica's folder holds at most its queue and backlog.
const (
	spoolWarnAge   = 24 * time.Hour
	spoolWarnBytes = 64 << 20
)

// spoolLines are status's lines of the spool's kept messages.
func spoolLines(waits []spoolWait, truncated bool, now time.Time) []string {
	var out []string
	for _, w := range waits {
		line := fmt.Sprintf("  %q → %s\t%d kept, oldest %s old, %s", w.alias, w.plugin, w.messages, ago(now, w.oldest), byteCount(w.bytes))
		if now.Sub(w.oldest) > spoolWarnAge || w.bytes > spoolWarnBytes {
			line += fmt.Sprintf("  WAITING past %s or %s: bind %s to %q again to deliver them, or drop them: %s",
				spoolWarnAge, byteCount(spoolWarnBytes), w.plugin, w.alias, dropCommand(w))
		}
		if w.atBound > 0 {
			line += fmt.Sprintf("  AT ITS BOUND (%s, channels.plugin.%s.spool_max_mb) for %s: new messages refused (503) until some are delivered",
				byteCount(w.atBound), w.alias, ago(now, w.fullSince))
		}
		out = append(out, line)
	}
	if truncated {
		out = append(out, fmt.Sprintf("  (more than %d entries: not all counted)", maxSpoolScan))
	}
	return out
}

// dropCommand is the command line that drops w.
func dropCommand(w spoolWait) string {
	if !configschema.ValidName(w.alias) {
		// Not a folder the sandbox wrote: nothing to paste into a shell.
		return "(not an alias name: remove its folder by hand, the stack stopped)"
	}
	if w.plugin == oldLayoutPlugin {
		return "clawmesh spool drop " + w.alias // every plugin's, and these
	}
	return "clawmesh spool drop " + w.alias + " --plugin " + w.plugin
}

// byteCount is n readably (B, KiB, MiB).
func byteCount(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// spoolSummary is one line of the whole spool (health's), "" when it
// keeps nothing.
func spoolSummary(waits []spoolWait, truncated bool) string {
	if len(waits) == 0 && !truncated {
		return ""
	}
	n, size, oldest, late, full := 0, int64(0), time.Time{}, false, 0
	now := time.Now()
	for _, w := range waits {
		n += w.messages
		size += w.bytes
		if oldest.IsZero() || w.oldest.Before(oldest) {
			oldest = w.oldest
		}
		late = late || now.Sub(w.oldest) > spoolWarnAge || w.bytes > spoolWarnBytes
		if w.atBound > 0 {
			full++
		}
	}
	line := fmt.Sprintf("channel spool: %d messages kept, not delivered yet (%s)", n, byteCount(size))
	if !oldest.IsZero() {
		line += fmt.Sprintf(", oldest %s old", ago(now, oldest))
	}
	if truncated {
		line += fmt.Sprintf(", more than %d entries: not all counted", maxSpoolScan)
	}
	if late {
		line += "; some WAITING past " + spoolWarnAge.String() + " or " + byteCount(spoolWarnBytes)
	}
	if full > 0 {
		line += fmt.Sprintf("; %d AT THEIR BOUND, refusing new messages (503)", full)
	}
	return line + " (clawmesh spool list)"
}
