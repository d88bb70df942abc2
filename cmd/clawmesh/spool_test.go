package main

import (
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/datadir"
)

// spoolOwner makes owner folder sub... under the spool of dir with its
// lock and one message per body, and returns it.
func spoolOwner(t *testing.T, dir string, bodies []string, sub ...string) string {
	t.Helper()
	owner := filepath.Join(append([]string{datadir.ChannelSpool(dir)}, sub...)...)
	if err := os.MkdirAll(owner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(owner, "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, b := range bodies {
		name := filepath.Join(owner, strings.Repeat("0", 19)+string(rune('1'+i))+"-hostmsg_x.msg")
		if err := os.WriteFile(name, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return owner
}

// A spool whose plugin is never bound again kept its messages for good,
// and the only way out was removing folders by hand with the stack
// stopped. spool drop removes them: never while a running replica holds
// the alias's folder for that plugin (its lock), never through a link,
// and all or nothing.
func TestSpoolDropRefusesAHeldSpoolAndFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	web := hex.EncodeToString([]byte("web"))
	p := func(name string) string { return "p-" + hex.EncodeToString([]byte(name)) }
	live := spoolOwner(t, dir, []string{`{"text":"live"}`}, web, p("webhook"), "r-live")
	dead := spoolOwner(t, dir, []string{`{"text":"a"}`, `{"text":"bb"}`}, web, p("gone"), "r-dead")
	old := spoolOwner(t, dir, []string{`{"text":"old"}`}, web, "r-old")
	outside := filepath.Join(t.TempDir(), "secret.msg")
	if err := os.WriteFile(outside, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dead, "00000000000000000009-hostmsg_y.msg")); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(live, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	// The alias bound (webhook's folder locked): refused, nothing gone.
	if _, _, err := dropSpool(dir, "web", ""); !errors.Is(err, errSpoolHeld) || !strings.Contains(err.Error(), "webhook") {
		t.Fatalf("drop of a held alias: %v, want refused naming webhook", err)
	}
	for _, f := range []string{live, dead, old} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("a refused drop removed %s: %v", f, err)
		}
	}
	// Another plugin's messages go; the link is removed, not followed.
	n, size, err := dropSpool(dir, "web", "gone")
	if err != nil || n != 2 || size != int64(len(`{"text":"a"}`)+len(`{"text":"bb"}`)) {
		t.Fatalf("drop of plugin gone = %d, %d, %v; want 2 messages", n, size, err)
	}
	if _, err := os.Lstat(filepath.Dir(dead)); !os.IsNotExist(err) {
		t.Fatalf("plugin gone's folder stays: %v", err)
	}
	if raw, err := os.ReadFile(outside); err != nil || string(raw) != "keep me" {
		t.Fatalf("the link's target: %q, %v", raw, err)
	}
	// Released (the replica gone): everything of the alias goes.
	lock.Close()
	if n, _, err := dropSpool(dir, "web", ""); err != nil || n != 2 {
		t.Fatalf("drop of the alias = %d, %v; want webhook's and the old layout's", n, err)
	}
	if _, err := os.Lstat(filepath.Join(datadir.ChannelSpool(dir), web)); !os.IsNotExist(err) {
		t.Fatalf("the alias's folder stays: %v", err)
	}
	// An alias folder that is a link is not followed.
	target := t.TempDir()
	spoolOwner(t, target, []string{`{}`}, "x", "r-1")
	if err := os.Symlink(filepath.Join(datadir.ChannelSpool(target), "x"), filepath.Join(datadir.ChannelSpool(dir), web)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := dropSpool(dir, "web", ""); err == nil {
		t.Fatal("drop through a linked alias folder succeeded")
	}
	if countKept(t, filepath.Join(datadir.ChannelSpool(target), "x", "r-1")) != 1 {
		t.Fatal("drop removed a message through a link")
	}
	// Names are checked before they become paths.
	for _, args := range [][]string{{"../web"}, {"web", "--plugin", "../x"}, {"a/b"}, {""}} {
		if err := spoolDropCmd(append(args, "--config-dir", dir), os.Stderr); err == nil {
			t.Fatalf("spool drop %q accepted", args)
		}
	}
}

func countKept(t *testing.T, dir string) int {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".msg") {
			n++
		}
	}
	return n
}

// A line waiting past the bound says so, with its bytes and the command
// that would drop it; a young one gets no warning.
func TestSpoolLinesWarnPastTheBound(t *testing.T) {
	now := time.Now()
	lines := spoolLines([]spoolWait{
		{alias: "web", plugin: "gone", messages: 2, bytes: 2048, oldest: now.Add(-48 * time.Hour)},
		{alias: "web", plugin: "webhook", messages: 1, bytes: 10, oldest: now.Add(-time.Minute)},
	}, false, now)
	if len(lines) != 2 || !strings.Contains(lines[0], "2.0 KiB") || !strings.Contains(lines[0], "WAITING") ||
		!strings.Contains(lines[0], "clawmesh spool drop web --plugin gone") || strings.Contains(lines[1], "WAITING") {
		t.Fatalf("lines %q", lines)
	}
	if s := spoolSummary([]spoolWait{{alias: "web", plugin: "gone", messages: 2, bytes: 2048, oldest: now.Add(-48 * time.Hour)}}, false); !strings.Contains(s, "2 messages kept") || !strings.Contains(s, "WAITING") {
		t.Fatalf("summary %q", s)
	}
}

// A spool that refuses new messages for its bound (the sandbox's mark in
// the plugin's folder) says so in status, spool list and health; a mark
// that is a link is not followed; drop takes the mark with the messages.
func TestSpoolLinesSayAtTheBound(t *testing.T) {
	dir := t.TempDir()
	web := hex.EncodeToString([]byte("web"))
	p := func(name string) string { return "p-" + hex.EncodeToString([]byte(name)) }
	spoolOwner(t, dir, []string{`{"text":"a"}`}, web, p("webhook"), "r-1")
	spoolOwner(t, dir, []string{`{"text":"b"}`}, web, p("other"), "r-2")
	full := filepath.Join(datadir.ChannelSpool(dir), web, p("webhook"), spoolFullMark)
	since := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	if err := os.WriteFile(full, []byte(`{"bound_bytes":1048576,"since":"`+since+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// Another plugin's mark is a link to a mark: not read.
	if err := os.Symlink(full, filepath.Join(datadir.ChannelSpool(dir), web, p("other"), spoolFullMark)); err != nil {
		t.Fatal(err)
	}
	waits, truncated := spoolWaiting(dir)
	lines := spoolLines(waits, truncated, time.Now())
	if len(lines) != 2 || !strings.Contains(lines[1], "AT ITS BOUND (1.0 MiB, channels.plugin.web.spool_max_mb)") ||
		!strings.Contains(lines[1], "refused (503)") || strings.Contains(lines[0], "AT ITS BOUND") {
		t.Fatalf("lines %q", lines)
	}
	if s := spoolSummary(waits, truncated); !strings.Contains(s, "1 AT THEIR BOUND") {
		t.Fatalf("summary %q", s)
	}
	if err := spoolDropCmd([]string{"web", "--config-dir", dir}, os.Stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(datadir.ChannelSpool(dir), web)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the alias's folder after drop: %v, want it gone with the mark", err)
	}
}

// A channel failed on a message its plugin's service holds leaves the
// spool's mark of it (held) in the plugin's folder. drop left the mark,
// so the folder stayed with no message in it and a later binding still
// knew the message. The mark goes with the plugin's queue dropped whole
// (or with no queue left), and the emptied folders go; a folder a
// replica is making (no lock yet) keeps it: that binding's mark.
func TestSpoolDropTakesTheHeldMark(t *testing.T) {
	dir := t.TempDir()
	web := hex.EncodeToString([]byte("web"))
	p := func(name string) string { return "p-" + hex.EncodeToString([]byte(name)) }
	mark := `{"version":1,"key":"` + strings.Repeat("ab", 32) + `","since":"2026-12-07T22:00:00Z"}`
	held := func(plugin string) string {
		path := filepath.Join(datadir.ChannelSpool(dir), web, p(plugin), "held")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(mark), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// The stalled binding unbound: next's file, and the mark.
	spoolOwner(t, dir, []string{`{"text":"next"}`}, web, p("webhook"), "r-1")
	held("webhook")
	// A plugin whose stall left no message behind: the mark alone.
	held("mail")
	if err := spoolDropCmd([]string{"web", "--config-dir", dir}, os.Stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(datadir.ChannelSpool(dir), web)); !errors.Is(err, os.ErrNotExist) {
		left, _ := filepath.Glob(filepath.Join(datadir.ChannelSpool(dir), web, "*", "*"))
		t.Fatalf("the alias's folder after drop: %v, holding %q; want it gone with the held mark", err, left)
	}

	// A replica making its folder (no lock in it yet): its plugin's
	// mark is that binding's, and stays.
	making := filepath.Join(datadir.ChannelSpool(dir), web, p("webhook"), "r-new")
	if err := os.MkdirAll(making, 0o700); err != nil {
		t.Fatal(err)
	}
	path := held("webhook")
	if err := spoolDropCmd([]string{"web", "--plugin", "webhook", "--config-dir", dir}, os.Stderr); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the mark beside a replica making its folder: %v, want kept", err)
	}
}
