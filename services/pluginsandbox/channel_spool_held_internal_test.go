package pluginsandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// The spool's mark of a held refused message is read by the spool of a
// later process on the same folder; one of another version, past its
// bound, or not a regular file is not read (its sender may be told
// again; nothing is skipped for it), and removing it spares another
// refusal's.
func TestChannelSpoolHeldMark(t *testing.T) {
	root := t.TempDir()
	sp, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	var nilSpool *channelSpool
	nilSpool.markHeld("k") // no spool: nothing kept
	if nilSpool.heldMark() != "" {
		t.Fatal("a nil spool holds a mark")
	}
	sp.markHeld("k0")
	sp.markHeld("k1") // a newer refusal's mark replaces the older one's
	sp.close()
	next, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer next.close()
	if got := next.heldMark(); got != "k1" {
		t.Fatalf("the next process reads %q, want k1", got)
	}
	next.unmarkHeld("k2")
	if got := next.heldMark(); got != "k1" {
		t.Fatalf("after another key's unmark: %q, want k1", got)
	}
	next.unmarkHeld("k1")
	if got := next.heldMark(); got != "" {
		t.Fatalf("after its unmark: %q", got)
	}
	mark := filepath.Join(next.dir, spoolHeldMark)
	for name, write := range map[string]func() error{
		"another version": func() error { return os.WriteFile(mark, []byte(`{"version":2,"key":"k1"}`), 0o600) },
		"past its bound": func() error {
			return os.WriteFile(mark, []byte(`{"version":1,"key":"k1","pad":"`+strings.Repeat("x", spoolHeldMax)+`"}`), 0o600)
		},
		"a symlink": func() error {
			other := filepath.Join(t.TempDir(), "m")
			if err := os.WriteFile(other, []byte(`{"version":1,"key":"k1"}`), 0o600); err != nil {
				return err
			}
			return os.Symlink(other, mark)
		},
	} {
		_ = os.Remove(mark)
		if err := write(); err != nil {
			t.Fatal(err)
		}
		if got := next.heldMark(); got != "" {
			t.Errorf("%s: read %q", name, got)
		}
	}

	// One process tells: the first to claim marks; a message met in
	// the plugin's service is told by whoever marked it, one read from
	// the queue only by a mark since its poll began.
	_ = os.Remove(mark)
	before := time.Now()
	if !next.claimHeld("k3", true, before) || next.heldMark() != "k3" {
		t.Fatal("the first claim of k3 does not tell, or marks nothing")
	}
	if next.claimHeld("k3", false, time.Now()) {
		t.Error("k3 met in the plugin's service, marked: told again")
	}
	if next.claimHeld("k3", true, before) {
		t.Error("k3 read from the queue in a poll that began before its mark: told again")
	}
	if !next.claimHeld("k3", true, time.Now().Add(time.Second)) {
		t.Error("k3 read from the queue in a poll after its mark (sent again): not told")
	}
}

// BenchmarkChannelSpoolHeldMark is what the spool's mark costs one
// refused message over its life: written at the refusal, read by a
// process that meets it again, removed once the plugin moves on. Paid
// per refusal, never per delivered message.
func BenchmarkChannelSpoolHeldMark(b *testing.B) {
	sp, err := openSpool(b.TempDir(), "web", "webhook", zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer sp.close()
	key := strings.Repeat("ab", 32)
	for b.Loop() {
		sp.markHeld(key)
		if sp.heldMark() != key {
			b.Fatal("mark not read")
		}
		sp.unmarkHeld(key)
	}
}
