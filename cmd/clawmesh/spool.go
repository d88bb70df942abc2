package main

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
)

const spoolUsage = `usage: clawmesh spool <command> [flags]

The channel spool keeps each message a channel accepted (answered 202)
until it is answered or its sender told, under <data>/channel-spool/, per
alias and plugin; a binding of that plugin under that alias delivers
what a stopped or dead replica left. Nothing is dropped by itself: a
plugin nobody binds again leaves its messages there, and status warns
once they wait past 24h or 64 MiB.

commands:
  list                  the kept messages per alias and plugin: count,
                        bytes, the oldest one's age
  drop ALIAS            drop the kept messages of ALIAS (every plugin's,
                        or --plugin NAME's alone); refused while a running
                        sandbox replica holds them (the alias bound to
                        that plugin); their senders are not told. The
                        mark of a message refused for its size that the
                        plugin's service held goes too: a binding after
                        it that meets that message again tells its
                        sender again
`

// spoolCmd runs `clawmesh spool`.
func spoolCmd(args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, spoolUsage)
		return usageErrorf("spool: want list or drop")
	}
	switch args[0] {
	case "list":
		return spoolListCmd(args[1:], out)
	case "drop":
		return spoolDropCmd(args[1:], out)
	}
	if isHelp(args[0]) {
		fmt.Fprint(out, spoolUsage)
		return nil
	}
	fmt.Fprint(os.Stderr, spoolUsage)
	return usageErrorf("spool: unknown subcommand %q", args[0])
}

// spoolFlags parses args (--config-dir, and what more adds) and returns
// the data directory; -h is helpRequested, whose usage main prints.
func spoolFlags(name string, args []string, more func(*flag.FlagSet)) (dir string, rest []string, err error) {
	fs := flag.NewFlagSet("spool "+name, flag.ContinueOnError)
	dirFlag := fs.String("config-dir", "", "data directory of the stack (default ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR, ~/.zeroclaw/data)")
	if more != nil {
		more(fs)
	}
	rest, err = parseArgs(fs, args)
	if err != nil {
		return "", nil, err
	}
	dir, err = datadir.Resolve(*dirFlag)
	return dir, rest, err
}

// spoolListCmd runs `clawmesh spool list`.
func spoolListCmd(args []string, out io.Writer) error {
	dir, rest, err := spoolFlags("list", args, nil)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return usageErrorf("spool list: want no arguments, got %q", rest)
	}
	waits, truncated := spoolWaiting(dir)
	if len(waits) == 0 && !truncated {
		_, err := fmt.Fprintln(out, "no channel messages kept")
		return err
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "channel messages kept, not delivered yet (alias → plugin):")
	for _, l := range spoolLines(waits, truncated, time.Now()) {
		fmt.Fprintln(w, l)
	}
	return w.Flush()
}

// errSpoolHeld: a running sandbox replica holds the messages drop was
// asked to drop.
var errSpoolHeld = errors.New("held by a running sandbox replica")

// spoolDropCmd runs `clawmesh spool drop ALIAS [--plugin NAME]`.
func spoolDropCmd(args []string, out io.Writer) error {
	var plugin *string
	dir, rest, err := spoolFlags("drop", args, func(fs *flag.FlagSet) {
		plugin = fs.String("plugin", "", "drop only the messages kept for this plugin (default: every plugin's, and an earlier release's)")
	})
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usageErrorf("spool drop: want one ALIAS, got %q", rest)
	}
	// Validated before either becomes a path (hex keeps them one
	// segment anyway): names the config and a manifest could give.
	alias := rest[0]
	if !configschema.ValidName(alias) {
		return usageErrorf("spool drop: %q is not a channel alias (letters, digits, _ : @ -, at most 64)", alias)
	}
	if *plugin != "" && !manifest.NamePattern.MatchString(*plugin) {
		return usageErrorf("spool drop: --plugin %q is not a plugin name (a-z, 0-9, _ and -, at most 64)", *plugin)
	}
	n, size, err := dropSpool(dir, alias, *plugin)
	if err != nil {
		return err
	}
	what := "alias " + alias
	if *plugin != "" {
		what += ", plugin " + *plugin
	}
	_, err = fmt.Fprintf(out, "dropped %d kept channel messages (%s) of %s; their senders were not told\n", n, byteCount(size), what)
	return err
}

// dropSpool removes the kept messages of alias (plugin's alone unless
// plugin is ""), and the folders that held them. Each owner folder's
// lock is taken first, as a replica adopting it takes it, so that drop
// and an adoption never share a folder; a lock it cannot take is a
// running replica's (the alias bound to that plugin, or adopting now),
// and then nothing is dropped. Nothing is followed through a link: a
// link in the spool is removed as a link, and an alias or plugin folder
// that is one is refused.
func dropSpool(dir, alias, plugin string) (n int, size int64, err error) {
	aliasDir := filepath.Join(datadir.ChannelSpool(dir), hex.EncodeToString([]byte(alias)))
	if fi, err := os.Lstat(aliasDir); errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil
	} else if err != nil {
		return 0, 0, fmt.Errorf("spool drop: %w", err)
	} else if !fi.IsDir() {
		return 0, 0, fmt.Errorf("spool drop: %s is not a folder (a link?): not followed; remove it by hand", aliasDir)
	}
	var owners []string
	pluginDirs := []string{}
	ents, err := os.ReadDir(aliasDir)
	if err != nil {
		return 0, 0, fmt.Errorf("spool drop: %w", err)
	}
	for _, e := range ents {
		path := filepath.Join(aliasDir, e.Name())
		name, isPlugin := strings.CutPrefix(e.Name(), "p-")
		switch {
		case !e.IsDir(): // a link or a file: never the spool's
		case !isPlugin:
			if plugin == "" {
				owners = append(owners, path) // an earlier release's
			}
		case plugin == "" || name == hex.EncodeToString([]byte(plugin)):
			pluginDirs = append(pluginDirs, path)
			sub, err := os.ReadDir(path)
			if err != nil {
				return 0, 0, fmt.Errorf("spool drop: %w", err)
			}
			for _, o := range sub {
				if o.IsDir() {
					owners = append(owners, filepath.Join(path, o.Name()))
				}
			}
		}
	}
	// Every lock first: all or nothing.
	var locks []*os.File
	defer func() {
		for _, f := range locks {
			f.Close()
		}
	}()
	var held []string
	var locked []string
	// making are the plugin folders where a replica is making its
	// owner folder: the held mark there is that binding's.
	making := map[string]bool{}
	for _, o := range owners {
		f, err := os.OpenFile(filepath.Join(o, "lock"), os.O_RDWR|unix.O_NOFOLLOW, 0)
		if errors.Is(err, fs.ErrNotExist) {
			// A replica making it (its lock comes next) or one
			// removing it once adopted: not touched.
			making[filepath.Dir(o)] = true
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("spool drop: %w", err)
		}
		locks = append(locks, f)
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			held = append(held, ownerPlugin(aliasDir, o))
			continue
		}
		locked = append(locked, o)
	}
	if len(held) > 0 {
		return 0, 0, fmt.Errorf("spool drop: the messages of alias %q for plugin %s are %w (the alias is bound to it): it delivers them; unbind the alias, or stop the stack, then drop",
			alias, strings.Join(uniq(held), ", "), errSpoolHeld)
	}
	for _, o := range locked {
		ents, err := os.ReadDir(o)
		if err != nil {
			return n, size, fmt.Errorf("spool drop: %w", err)
		}
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".msg") {
				continue
			}
			if e.Type().IsRegular() {
				if fi, err := e.Info(); err == nil {
					n++
					size += fi.Size()
				}
			}
		}
		// Under the lock, as an adopter removes a folder it emptied.
		_ = os.Remove(filepath.Join(o, "lock"))
		if err := os.RemoveAll(o); err != nil {
			return n, size, fmt.Errorf("spool drop: %w", err)
		}
	}
	// Emptied folders go; one a replica just made stays (not empty).
	// The at-the-bound mark goes with the messages it was about: no
	// replica held them, so none refuses for them now.
	//
	// So does the held mark (a message refused for its size that the
	// plugin's own service holds, whose sender was told), with the
	// plugin's queue dropped whole, which is the only way drop drops
	// (every owner's lock, or nothing). Not "when its message is among
	// those dropped": that message's file went at its refusal, and the
	// mark is a digest of the plugin's fields, not of a kept file, so no
	// kept message can be matched to it. Left, it kept the folder with no
	// message in it for good, and a binding of the plugin weeks later
	// still took a message of that digest as told. Dropped, a binding
	// that meets the message again tells its sender once more: drop is
	// the operator's word that the alias starts over for that plugin.
	for _, p := range pluginDirs {
		_ = os.Remove(filepath.Join(p, spoolFullMark))
		if !making[p] {
			_ = os.Remove(filepath.Join(p, spoolHeldMark))
		}
		_ = os.Remove(p)
	}
	_ = os.Remove(aliasDir)
	return n, size, nil
}

// ownerPlugin names the plugin of owner folder o under aliasDir.
func ownerPlugin(aliasDir, o string) string {
	rel, _ := filepath.Rel(aliasDir, o)
	first, _, _ := strings.Cut(rel, string(filepath.Separator))
	if name, ok := strings.CutPrefix(first, "p-"); ok {
		if raw, err := hex.DecodeString(name); err == nil {
			return string(raw)
		}
	}
	return oldLayoutPlugin
}

// uniq is names without repeats, in order.
func uniq(names []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
