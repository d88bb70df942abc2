package pluginsandbox

import (
	"os"
	"path/filepath"
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
		if _, err := live.write([]byte(m)); err != nil {
			t.Fatal(err)
		}
		if _, err := dead.write([]byte(m)); err != nil {
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
	if _, err := dead.write([]byte(`{"id":"1","text":"for the webhook plugin"}`)); err != nil {
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
	file, err := dead.write([]byte(`{"text":"no id"}`))
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
		f, err := sp.write(msg)
		if err != nil {
			b.Fatal(err)
		}
		sp.drop(f)
	}
}
