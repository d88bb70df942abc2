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
	live, err := openSpool(root, "web", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer live.close()
	dead, err := openSpool(root, "web", zap.NewNop())
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

	next, err := openSpool(root, "web", zap.NewNop())
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

// BenchmarkChannelSpoolWrite is what keeping one accepted message adds to
// the listener's answer: a file written, synced and linked, its folder
// synced.
func BenchmarkChannelSpoolWrite(b *testing.B) {
	sp, err := openSpool(b.TempDir(), "web", zap.NewNop())
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
