package pluginsandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// boundOf1MiB is the smallest spool_max_mb: five messages of about
// 200 kB (49 blocks each) fit it, a sixth does not.
const boundOf1MiB = 1 << 20

func bigKept(id string) []byte {
	return []byte(`{"id":"` + id + `","text":"` + strings.Repeat("x", 200_000) + `"}`)
}

// keptCost is what the messages on disk under root cost, as the bound
// counts them: every owner's, the dead ones' too.
func keptCost(t *testing.T, root string) int64 {
	t.Helper()
	var n int64
	_ = filepath.WalkDir(root, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(d.Name(), spoolExt) {
			if fi, err := d.Info(); err == nil {
				n += spoolCost(fi.Size())
			}
		}
		return nil
	})
	return n
}

// openOwner opens an owner of the spool of web for webhook under root,
// as a replica does at its first binding, closed at the test's end.
func openOwner(t *testing.T, root string) *channelSpool {
	t.Helper()
	sp, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.close)
	return sp
}

// die lets go of what an owner's process holds, as the kernel does when
// it dies: its folder's lock and its count's.
func die(sp *channelSpool) {
	sp.lock.Close()
	sp.ledger.Close()
}

// Two replicas of one channel's plugin took messages each as if the
// other's folder held what it held at its last look (at open, then every
// 5 s): both opened on an empty spool, each took a bound's worth, and
// the disk held twice the bound. Each owner now counts the others' as
// they are at the message (their count, reserved before the file is
// written) under a lock of the plugin's folder, so the check and the
// reservation are one step across processes. No look (settle) runs
// here: the other's count is as stale as the look's period allows.
func TestChannelSpoolBoundHeldAcrossOwners(t *testing.T) {
	root := t.TempDir()
	a, b := openOwner(t, root), openOwner(t, root)
	taken := map[*channelSpool][]string{}
	for i := range 12 {
		sp := a
		if i%2 == 1 {
			sp = b
		}
		f, err := sp.write(bigKept("m"), boundOf1MiB)
		if err == nil {
			taken[sp] = append(taken[sp], f)
		} else if err != errSpoolFull {
			t.Fatal(err)
		}
		if got := keptCost(t, root); got > boundOf1MiB {
			t.Fatalf("after message %d the spool holds %d bytes (%d taken by one owner, %d by the other), past its bound of %d",
				i+1, got, len(taken[a]), len(taken[b]), boundOf1MiB)
		}
	}
	if n := len(taken[a]) + len(taken[b]); n != 5 {
		t.Fatalf("%d messages taken, want the 5 the bound holds", n)
	}
	// What one owner delivers the other may take at once: no look is
	// needed for room either.
	b.drop(taken[b][0])
	if _, err := a.write(bigKept("again"), boundOf1MiB); err != nil {
		t.Fatalf("a message once the other owner delivered one: %v", err)
	}
	if _, err := b.write(bigKept("past"), boundOf1MiB); err != errSpoolFull {
		t.Fatalf("a message past the bound once the room was taken: %v", err)
	}
}

// An owner that dies between two looks leaves its messages on disk: the
// owners still running count them at once (its folder is read as its
// files once its count is nobody's), not at their next look.
func TestChannelSpoolBoundCountsAnOwnerThatDiedSinceTheLook(t *testing.T) {
	root := t.TempDir()
	a, b := openOwner(t, root), openOwner(t, root)
	for i := range 5 {
		if _, err := a.write(bigKept("m"), boundOf1MiB); err != nil {
			t.Fatalf("m%d: %v", i+1, err)
		}
	}
	die(a)
	if _, err := b.write(bigKept("m6"), boundOf1MiB); err != errSpoolFull {
		t.Fatalf("a message past the bound, its owner dead: %v; want refused", err)
	}
	if got := keptCost(t, root); got > boundOf1MiB {
		t.Fatalf("the spool holds %d bytes, past its bound of %d", got, boundOf1MiB)
	}
	// Adopted, they are counted once, as the adopter's: still full,
	// and room again once it delivered them.
	q := wasmhost.NewInboundQueue(10, 0)
	if n := b.adopt(q); n != 5 {
		t.Fatalf("adopted %d of the dead owner's 5", n)
	}
	if _, err := b.write(bigKept("m7"), boundOf1MiB); err != errSpoolFull {
		t.Fatalf("a message past the bound, adopted: %v; want refused", err)
	}
	adopted, _ := filepath.Glob(filepath.Join(b.own, "*"+spoolExt))
	b.drop(adopted...)
	if _, err := b.write(bigKept("m8"), boundOf1MiB); err != nil {
		t.Fatalf("a message once the adopted ones were delivered: %v", err)
	}
}

// BenchmarkChannelSpoolReserve is what the bound's check costs a message
// with two other live replicas and a dead one's folder (a message each):
// the reservation and its release, each under the plugin folder's lock,
// reading the others' counts. No file is written.
func BenchmarkChannelSpoolReserve(b *testing.B) {
	root := b.TempDir()
	var others []*channelSpool
	for range 3 {
		sp, err := openSpool(root, "web", "webhook", zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sp.write([]byte(`{"id":"m0"}`), DefaultSpoolMaxMB<<20); err != nil {
			b.Fatal(err)
		}
		others = append(others, sp)
	}
	die(others[2])
	defer func() {
		for _, sp := range others {
			sp.close()
		}
	}()
	sp, err := openSpool(root, "web", "webhook", zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer sp.close()
	for b.Loop() {
		ok, err := sp.reserve(spoolBlock, DefaultSpoolMaxMB<<20)
		if !ok || err != nil {
			b.Fatal(ok, err)
		}
		sp.release(spoolBlock)
	}
}

// BenchmarkChannelSpoolCountByFiles is what counting a folder by its
// files costs at 16 MiB of small messages (4,096 files): what a count
// read fresh from the files at each message would cost, where the
// ledger is one read a replica.
func BenchmarkChannelSpoolCountByFiles(b *testing.B) {
	dir := b.TempDir()
	for i := range 4096 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%020d%s", i, spoolExt)), []byte(`{"id":"m"}`), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if n, _ := ownerFiles(dir); n != 4096*spoolBlock {
			b.Fatal(n)
		}
	}
}

// An adopter that took part of a dead owner's messages (its queue held
// three of five) and delivered them left two on disk, but a replica that
// had counted the dead folder by its files before the adoption kept
// counting all five until its next look (5 s): it refused a message the
// bound had room for. The adopter's move is now one locked step with its
// count, and a folder counted by its files is counted again once it
// changed, so the others count the two left from the adoption on.
func TestChannelSpoolBoundExactRightAfterAnAdoption(t *testing.T) {
	root := t.TempDir()
	a := openOwner(t, root)
	for i := range 5 {
		if _, err := a.write(bigKept("m"), boundOf1MiB); err != nil {
			t.Fatalf("m%d: %v", i+1, err)
		}
	}
	die(a)
	c := openOwner(t, root) // counts the dead folder's five
	b := openOwner(t, root)
	q := wasmhost.NewInboundQueue(3, 0)
	if n := b.adopt(q); n != 3 {
		t.Fatalf("adopted %d of the dead owner's 5 into a queue of 3", n)
	}
	adopted, _ := filepath.Glob(filepath.Join(b.own, "*"+spoolExt))
	b.drop(adopted...)
	// Two left in the dead folder: three more fit, a fourth does not.
	for i := range 3 {
		if _, err := c.write(bigKept("c"), boundOf1MiB); err != nil {
			t.Fatalf("message %d after the adoption, %d bytes on disk: %v; want taken", i+1, keptCost(t, root), err)
		}
	}
	if _, err := c.write(bigKept("past"), boundOf1MiB); err != errSpoolFull {
		t.Fatalf("a message past the bound after the adoption: %v; want refused", err)
	}
	if got := keptCost(t, root); got > boundOf1MiB {
		t.Fatalf("the spool holds %d bytes, past its bound of %d", got, boundOf1MiB)
	}
}

// A running replica of the release before the counts (no kept file) was
// counted by its files as of the others' last look: what it took since
// was room the others took again. Its folder is now counted again at the
// message once it changed (its files, a directory listing bounded by
// spoolRescanMax).
func TestChannelSpoolBoundCountsAnOwnerWithoutCountAtTheMessage(t *testing.T) {
	root := t.TempDir()
	c := openOwner(t, root)
	// The old release's owner: its folder, locked, no kept file.
	old, err := os.MkdirTemp(c.dir, "r-")
	if err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(old, spoolLock), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	c.settle(boundOf1MiB) // the look: it holds nothing
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(old, fmt.Sprintf("%020d%s", i+1, spoolExt)), bigKept("old"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.write(bigKept("new"), boundOf1MiB); err != errSpoolFull {
		t.Fatalf("a message past the bound, the old release's owner holding five: %v; want refused (%d bytes on disk)", err, keptCost(t, root))
	}
	// What it delivers is room at once.
	_ = os.Remove(filepath.Join(old, fmt.Sprintf("%020d%s", 1, spoolExt)))
	if _, err := c.write(bigKept("new"), boundOf1MiB); err != nil {
		t.Fatalf("a message once the old release's owner delivered one: %v", err)
	}
}
