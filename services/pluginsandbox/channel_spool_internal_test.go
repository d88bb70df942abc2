package pluginsandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// A spool adopts the messages of an owner that is gone (its lock free),
// in the order it accepted them, and removes its folder; an owner that
// lives (its lock held) keeps its own; what the queue has no room for
// stays for a later adopt.
func TestChannelSpoolAdoptsOnlyTheDeadOwners(t *testing.T) {
	root := t.TempDir()
	live, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer live.close()
	dead, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{`{"id":"1"}`, `{"id":"2"}`, `{"id":"3"}`} {
		if _, err := live.write([]byte(m), DefaultSpoolMaxMB<<20); err != nil {
			t.Fatal(err)
		}
		if _, err := dead.write([]byte(m), DefaultSpoolMaxMB<<20); err != nil {
			t.Fatal(err)
		}
	}
	dead.lock.Close() // as the kernel does when its process dies

	next, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer next.close()
	q := wasmhost.NewInboundQueue(2, 0)
	if n := next.adopt(q); n != 2 {
		t.Fatalf("adopted %d into a queue of 2, want 2", n)
	}
	if got := q.Pending(); got != 2 {
		t.Fatalf("queued %d", got)
	}
	left, _ := filepath.Glob(filepath.Join(dead.own, "*"+spoolExt))
	if len(left) != 1 {
		t.Fatalf("the dead owner's folder holds %v, want the message the queue had no room for", left)
	}
	q = wasmhost.NewInboundQueue(10, 0)
	if n := next.adopt(q); n != 1 {
		t.Fatalf("second adopt took %d, want the one left", n)
	}
	if _, err := os.Stat(dead.own); !os.IsNotExist(err) {
		t.Fatalf("the dead owner's folder stays: %v", err)
	}
	mine, _ := filepath.Glob(filepath.Join(live.own, "*"+spoolExt))
	if len(mine) != 3 {
		t.Fatalf("the live owner holds %d messages, want its 3", len(mine))
	}
	taken, _ := filepath.Glob(filepath.Join(next.own, "*"+spoolExt))
	if len(taken) != 3 {
		t.Fatalf("the adopter holds %d files, want the dead owner's 3", len(taken))
	}
}

// The messages a replica accepted for an alias bound to one plugin are
// not adopted by a binding of the alias to another plugin: their shape is
// the first plugin's, and the spool keyed by the alias alone fed them to
// the second (and its agent answered them). They stay for a binding of
// their own plugin, which adopts them.
func TestChannelSpoolAdoptsOnlyItsPluginsMessages(t *testing.T) {
	root := t.TempDir()
	dead, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dead.write([]byte(`{"id":"1","text":"for the webhook plugin"}`), DefaultSpoolMaxMB<<20); err != nil {
		t.Fatal(err)
	}
	dead.lock.Close() // the replica died

	other, err := openSpool(root, "web", "chat", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	q := wasmhost.NewInboundQueue(10, 0)
	if n := other.adopt(q); n != 0 || q.Pending() != 0 {
		t.Fatalf("a binding of plugin chat adopted %d of plugin webhook's messages, want none", n)
	}
	if !other.strayed.Load() {
		t.Fatal("the other plugin's messages were not looked for, to be logged")
	}
	same, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer same.close()
	if n := same.adopt(q); n != 1 {
		t.Fatalf("a binding of plugin webhook adopted %d of its messages, want 1", n)
	}
}

// The host id a message is given at the 202 stays with it when another
// replica adopts it, and is the one it is polled with: given at each
// poll, a message without an id of its plugin's had a new idempotency
// key at each delivery, and its cut turn ran again.
func TestChannelSpoolKeepsTheHostID(t *testing.T) {
	root := t.TempDir()
	dead, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	file, err := dead.write([]byte(`{"text":"no id"}`), DefaultSpoolMaxMB<<20)
	if err != nil {
		t.Fatal(err)
	}
	first := &wasmhost.ChannelMessage{Content: "no id"}
	hostMessageID(first, []string{file})
	if !validHostID(first.ID) {
		t.Fatalf("host id %q", first.ID)
	}
	dead.lock.Close()

	next, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer next.close()
	q := wasmhost.NewInboundQueue(10, 0)
	if n := next.adopt(q); n != 1 {
		t.Fatalf("adopted %d", n)
	}
	taken, _ := filepath.Glob(filepath.Join(next.own, "*"+spoolExt))
	if len(taken) != 1 {
		t.Fatalf("the adopter holds %v", taken)
	}
	again := &wasmhost.ChannelMessage{Content: "no id"}
	hostMessageID(again, taken)
	if again.ID != first.ID || messageKey(again) != messageKey(first) {
		t.Fatalf("redelivered with id %q, key %s; first delivered with %q, key %s", again.ID, messageKey(again), first.ID, messageKey(first))
	}
	// A file of the older release names no id: a new one is given.
	legacy := filepath.Join(next.own, "00000000000000000099"+spoolExt)
	other := &wasmhost.ChannelMessage{}
	hostMessageID(other, []string{legacy})
	if !validHostID(other.ID) || other.ID == first.ID {
		t.Fatalf("a legacy file's message got id %q", other.ID)
	}
	// The plugin's own id is kept.
	own := &wasmhost.ChannelMessage{ID: "m1"}
	hostMessageID(own, taken)
	if own.ID != "m1" {
		t.Fatalf("the plugin's id became %q", own.ID)
	}
}

// BenchmarkChannelSpoolWrite is what keeping one accepted message adds to
// the listener's answer: a file written, synced and linked, its folder
// synced.
func BenchmarkChannelSpoolWrite(b *testing.B) {
	sp, err := openSpool(b.TempDir(), "web", "webhook", zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer sp.close()
	msg := []byte(`{"id":"m1","from":"ann","text":"hello from the channel","thread":"t-1"}`)
	for b.Loop() {
		f, err := sp.write(msg, 1<<40)
		if err != nil {
			b.Fatal(err)
		}
		sp.drop(f)
	}
}

// A plugin's message id joins the idempotency key with a NUL, so an id
// holding one (or any control character, or too long) is refused; the
// key of every valid id is the one the release before gave it, so a
// message cut by an upgrade still finds its turn.
func TestMessageIDValidation(t *testing.T) {
	for id, want := range map[string]bool{
		"": true, "m1": true, "1733491200.000100": true, "$ev:example.org": true, "été": true,
		"a\x00b": false, "a\nb": false, "\x7f": false, "\xff": false, strings.Repeat("x", maxMessageIDLen+1): false,
	} {
		if got := validMessageID(id); got != want {
			t.Errorf("validMessageID(%q) = %v, want %v", id, got, want)
		}
	}
	// The key of the release before (sha256 of id NUL content).
	msg := &wasmhost.ChannelMessage{ID: "m1", Content: "hello"}
	if got := messageKey(msg); got != "chanmsg_"+legacyKey("m1", "hello") {
		t.Fatalf("key %s changed for a valid id", got)
	}
}

// legacyKey is the hash part of messageKey as the release before made it.
func legacyKey(id, content string) string {
	sum := sha256.Sum256([]byte(id + "\x00" + content))
	return hex.EncodeToString(sum[:16])
}

// The messages the release before the plugin-keyed layout kept
// (<alias>/<owner>/, no plugin) are adopted by the alias's binding, and
// moved into the current layout: they were logged and left for good. An
// entry that is a symlink is neither followed nor delivered.
func TestChannelSpoolAdoptsTheOldLayout(t *testing.T) {
	root := t.TempDir()
	old := filepath.Join(root, hex.EncodeToString([]byte("web")), "r-old")
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "secret.json")
	for path, body := range map[string]string{
		filepath.Join(old, spoolLock):                  "",
		filepath.Join(old, "00000000000000000001.msg"): `{"id":"o1","text":"kept by the old release"}`,
		outside: `{"id":"s1","text":"secret"}`,
	} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(old, "00000000000000000002.msg")); err != nil {
		t.Fatal(err)
	}
	sp, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	q := wasmhost.NewInboundQueue(10, 0)
	if n := sp.adopt(q); n != 1 || q.Pending() != 1 {
		t.Fatalf("adopted %d (queued %d) of the old layout's message, want 1", n, q.Pending())
	}
	if _, err := os.Lstat(old); !os.IsNotExist(err) {
		t.Fatalf("the old layout's folder stays: %v", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("the symlink's target: %v", err)
	}
	if n := sp.adopt(q); n != 0 {
		t.Fatalf("adopted %d again", n)
	}
}
