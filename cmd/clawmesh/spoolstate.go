package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

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

// spoolWait is the kept messages of one alias bound to one plugin.
type spoolWait struct {
	alias, plugin string
	messages      int
	oldest        time.Time
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
			plugin, owners := "(no plugin named: an earlier release's)", []os.DirEntry{p}
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

// spoolLines are status's lines of the spool's kept messages.
func spoolLines(waits []spoolWait, truncated bool, now time.Time) []string {
	var out []string
	for _, w := range waits {
		out = append(out, fmt.Sprintf("  %q → %s\t%d kept, oldest %s old", w.alias, w.plugin, w.messages, ago(now, w.oldest)))
	}
	if truncated {
		out = append(out, fmt.Sprintf("  (more than %d entries: not all counted)", maxSpoolScan))
	}
	return out
}
