package pluginsandbox_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// newKVServer is a sandbox serving the example kv, from a plugins folder
// of its own.
func newKVServer(t testing.TB) *testServer {
	t.Helper()
	dir := t.TempDir()
	installExample(t, dir, "kv")
	return newTestServer(t, dir)
}

// installTestKV installs kv with two changes for tests of the sandbox: a
// recall of "spin" spends the call's fuel (and stops the instance), and
// kv's own bound on what it holds is taken away, so that the sandbox's
// bounds are the ones met.
func installTestKV(t testing.TB, dir string) {
	t.Helper()
	if err := guestbuild.Install(dir, "kv"); err != nil {
		t.Fatal(err)
	}
	replaceKV(t, dir, "testhooks.go", `//go:build wasip1

package main

import "github.com/clawmesh/clawmesh/plugins/pdk/memory"

type hooked struct{ kv }

var spins int

func (h hooked) Recall(query string, limit int) ([]memory.Entry, error) {
	for query == "spin" {
		spins++
	}
	return h.kv.Recall(query, limit)
}

func init() { maxBytes = 1 << 30; memory.Register(hooked{}) } // after main.go's init
`)
}

// replaceKV builds kv with the file name added, holding src, and puts it
// in place of the module installed in dir/kv.
func replaceKV(t testing.TB, dir, name, src string) {
	t.Helper()
	wasm, err := guestbuild.WasmWith("kv", name, src)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(wasm)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "kv", "plugin.wasm"), data, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// spin stops the instance of a kv installed by installTestKV.
func spin(t testing.TB, ts *testServer) {
	t.Helper()
	_, err := ts.MemoryRecall(context.Background(), &pluginv1.MemoryRecallRequest{Query: "spin", Limit: 100})
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "out of fuel") {
		t.Fatalf("the recall that stops the instance: %v", err)
	}
}

func store(t testing.TB, ts *testServer, key, content string) error {
	t.Helper()
	_, err := ts.MemoryStore(context.Background(), &pluginv1.MemoryStoreRequest{Entry: &pluginv1.MemoryEntry{Key: key, Content: content}})
	return err
}

// storeN stores n entries of content under keys made by key from 0 to
// n-1, and stops the test at the first that fails.
func storeN(t testing.TB, ts *testServer, key string, n int, content string) {
	t.Helper()
	for i := range n {
		if err := store(t, ts, fmt.Sprintf(key, i), content); err != nil {
			t.Fatalf("store %s: %v", fmt.Sprintf(key, i), err)
		}
	}
}

func recallKeys(t *testing.T, ts *testServer, query string, limit int32) []string {
	t.Helper()
	got, err := ts.MemoryRecall(context.Background(), &pluginv1.MemoryRecallRequest{Query: query, Limit: limit})
	if err != nil {
		t.Fatalf("recall %q: %v", query, err)
	}
	var keys []string
	for _, e := range got.Entries {
		keys = append(keys, e.Key)
	}
	return keys
}

// A recall of four memories of 1 MiB each (each within the store's bound)
// spent kv's fuel and stopped its instance (TestKVRecallsAtTheBounds); the
// sandbox rebuilt it empty, so every memory was lost to one recall. The
// rebuilt instance now gets its entries back, in the order they were
// stored.
func TestMemoriesOutliveTheirInstance(t *testing.T) {
	dir := t.TempDir()
	installTestKV(t, dir)
	ts := newTestServer(t, dir)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if err := store(t, ts, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	storeN(t, ts, "big%d", 4, strings.Repeat("z", 1<<20))
	if err := store(t, ts, "a", "note a, again"); err != nil { // a is now the newest
		t.Fatal(err)
	}
	spin(t, ts)
	for i := range 4 {
		got, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: fmt.Sprintf("big%d", i)})
		if err != nil || !got.Existed {
			t.Fatalf("forget big%d after the instance stopped: %v %v", i, got, err)
		}
	}
	if got := recallKeys(t, ts, "note", 10); strings.Join(got, ",") != "a,c,b" {
		t.Fatalf("recall after the rebuild, newest first: %v", got)
	}
	// A rebuild after forgetting gives back what is left, not more.
	spin(t, ts)
	if got := recallKeys(t, ts, "z", 10); len(got) != 0 {
		t.Fatalf("forgotten entries came back: %v", got)
	}
}

// What the sandbox keeps of a memory plugin is bounded, and a store past a
// bound is refused without touching what is stored.
func TestMemoryBounds(t *testing.T) {
	dir := t.TempDir()
	installTestKV(t, dir)
	ts := newTestServer(t, dir)
	ctx := context.Background()
	// An entry's labels are bounded like its key: a category of 15 MiB
	// passed, within one message, and came back with every recall.
	for _, e := range []*pluginv1.MemoryEntry{
		{Key: "k", Content: "x", Category: strings.Repeat("c", 513)},
		{Key: "k", Content: "x", SessionId: strings.Repeat("s", 513)},
	} {
		_, err := ts.MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Entry: e})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "512 bytes") {
			t.Fatalf("an entry with a label of 513 bytes: %v", err)
		}
	}
	mib := strings.Repeat("y", 1<<20)
	n := pluginsandbox.MaxMemoryBytes / (1 << 20)
	storeN(t, ts, "m%02d", n-1, mib)
	err := store(t, ts, "one-too-many", mib)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), fmt.Sprint(pluginsandbox.MaxMemoryBytes)) {
		t.Fatalf("store past the byte bound: %v", err)
	}
	// Replacing an entry counts its new size only.
	if err := store(t, ts, "m00", mib[:1<<19]); err != nil {
		t.Fatalf("replace: %v", err)
	}
	for i := range n - 1 {
		if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: fmt.Sprintf("m%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range pluginsandbox.MaxMemoryEntries {
		if err := store(t, ts, fmt.Sprintf("e%05d", i), "x"); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	err = store(t, ts, "e-new", "x")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), fmt.Sprint(pluginsandbox.MaxMemoryEntries)) {
		t.Fatalf("store past the entry bound: %v", err)
	}
	if err := store(t, ts, "e00000", "replaced"); err != nil {
		t.Fatalf("replace at the bound: %v", err)
	}
	if got := recallKeys(t, ts, "replaced", 5); len(got) != 1 || got[0] != "e00000" {
		t.Fatalf("recall: %v", got)
	}
}

// BenchmarkMemoryRebuild times the call after an instance stopped: the
// rebuild and the stores that give it back MaxMemoryEntries entries (4 MiB
// of them in four, the rest 100 bytes each).
func BenchmarkMemoryRebuild(b *testing.B) {
	dir := b.TempDir()
	installTestKV(b, dir)
	ts := newTestServer(b, dir)
	ctx := context.Background()
	storeN(b, ts, "s%05d", pluginsandbox.MaxMemoryEntries-4, strings.Repeat("s", 100))
	storeN(b, ts, "big%d", 4, strings.Repeat("z", 1<<20))
	for b.Loop() {
		b.StopTimer()
		spin(b, ts)
		b.StartTimer()
		if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "absent"}); err != nil {
			b.Fatal(err)
		}
	}
}

// A plugin loaded again (its folder changed, or the signature policy)
// got a new, empty instance: every memory was lost to an edit of its
// manifest. The new load now gets the entries of the one it replaces.
func TestMemoriesOutliveAReload(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "kv")
	ts := newTestServer(t, dir)
	for _, k := range []string{"a", "b", "c", "a"} {
		if err := store(t, ts, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "kv", "manifest.toml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n# edited\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ts.rescan(t)
	if n := ts.logs.FilterMessage("plugin loaded").Len(); n != 2 {
		t.Fatalf("the plugin loaded %d times", n)
	}
	if got := recallKeys(t, ts, "note", 10); strings.Join(got, ",") != "a,c,b" {
		t.Fatalf("recall after the reload, newest first: %v", got)
	}
	if err := store(t, ts, "d", "note d"); err != nil {
		t.Fatal(err)
	}
	if got := recallKeys(t, ts, "note", 10); strings.Join(got, ",") != "d,a,c,b" {
		t.Fatalf("recall after a store on the new load: %v", got)
	}
}

// A restore cut midway by the caller's deadline holds the entries stored
// so far and not the rest; the next call restores again rather than
// answer from it (the cut store stops the instance, and the ledger stays
// partial).
func TestMemoryRestoreCutMidway(t *testing.T) {
	dir := t.TempDir()
	installTestKV(t, dir)
	ts := newTestServer(t, dir)
	ctx := context.Background()
	const n = 2000
	storeN(t, ts, "n%04d", n, "note")
	storeN(t, ts, "big%d", 4, strings.Repeat("z", 1<<20))
	spin(t, ts)
	// Deadlines from 1 ms up until one ends the restore between two of
	// its stores.
	cut := false
	for d := time.Millisecond; d < 10*time.Second && !cut; d *= 2 {
		dctx, cancel := context.WithTimeout(ctx, d)
		_, err := ts.MemoryForget(dctx, &pluginv1.MemoryForgetRequest{Key: "absent"})
		cancel()
		for _, e := range ts.logs.TakeAll() {
			if e.Message == "rebuild memory plugin" && strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "store entry") &&
				!strings.Contains(fmt.Sprint(e.ContextMap()["error"]), "store entry 1 of") {
				cut = true
			}
		}
		if err == nil { // the restore finished in time: stop it again
			spin(t, ts)
		}
	}
	if !cut {
		t.Fatal("no deadline ended the restore midway")
	}
	if missing := forgetMissing(t, ts, "n%04d", n); missing > 0 {
		t.Fatalf("after a restore cut midway, %d of %d entries were missing", missing, n)
	}
}

// forgetMissing forgets the entries keyed by key (a format) from 0 to n-1 and
// returns how many the plugin did not hold.
func forgetMissing(t *testing.T, ts *testServer, key string, n int) (missing int) {
	t.Helper()
	for i := range n {
		got, err := ts.MemoryForget(context.Background(), &pluginv1.MemoryForgetRequest{Key: fmt.Sprintf(key, i)})
		if err != nil {
			t.Fatal(err)
		}
		if !got.Existed {
			missing++
		}
	}
	return missing
}

// A restore whose caller goes between two of its stores leaves the
// instance alive, holding the entries given so far and no error of its
// own: only the ledger's partial flag stops the next call answering from
// it. (TestMemoryRestoreCutMidway cuts where the deadline falls, mostly
// inside a store, which stops the instance whatever the flag says.)
func TestMemoryRestoreCutBetweenStores(t *testing.T) {
	dir := t.TempDir()
	installTestKV(t, dir)
	ts := newTestServer(t, dir)
	const n = 50
	storeN(t, ts, "n%02d", n, "note")
	spin(t, ts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	undo := pluginsandbox.SetRestoreHook(func(i int) {
		if i == 20 {
			cancel()
		}
	})
	_, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "absent"})
	undo()
	if err == nil {
		t.Fatal("the call whose caller went midway through its restore succeeded")
	}
	if missing := forgetMissing(t, ts, "n%02d", n); missing > 0 {
		t.Fatalf("after a restore cut between two stores, %d of %d entries were missing", missing, n)
	}
}

// A new version of a memory plugin may refuse an entry the old one
// accepted. The restore that gives the new load its entries stopped at
// that entry, and every later call rebuilt the instance and stopped there
// again: one entry made the plugin unusable. A refused entry is now
// dropped, with a warning, and the rest are given back.
func TestMemoryRestoreDropsARefusedEntry(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "kv")
	ts := newTestServer(t, dir)
	for _, k := range []string{"a", "b", "c"} {
		content := "note " + k
		if k == "b" {
			content += " refuse-me"
		}
		if err := store(t, ts, k, content); err != nil {
			t.Fatal(err)
		}
	}
	// The same kv, with a Store that refuses one content.
	replaceKV(t, dir, "refuse.go", `//go:build wasip1

package main

import (
	"errors"
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

type stricter struct{ kv }

func (s stricter) Store(e memory.Entry) error {
	if strings.Contains(e.Content, "refuse-me") {
		return errors.New("content not accepted")
	}
	return s.kv.Store(e)
}

func init() { memory.Register(stricter{}) } // after main.go's init
`)
	ts.rescan(t)
	if n := ts.logs.FilterMessage("plugin loaded").Len(); n != 2 {
		t.Fatalf("the plugin loaded %d times", n)
	}
	for range 2 {
		if got := recallKeys(t, ts, "note", 10); strings.Join(got, ",") != "c,a" {
			t.Fatalf("recall on the stricter load: %v", got)
		}
	}
	warned := ts.logs.FilterMessage("memory plugin refused entries it was given back; they are dropped").All()
	if len(warned) != 1 || fmt.Sprint(warned[0].ContextMap()["keys"]) != "[b]" {
		t.Fatalf("warnings: %v", warned)
	}
	if n := ts.logs.FilterMessage("rebuilding the memory plugin's instance with its entries").Len(); n != 1 {
		t.Fatalf("%d rebuilds, want the one after the reload", n)
	}
	if err := store(t, ts, "d", "note d refuse-me"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a store the new load refuses: %v", err)
	}
}

// kv lowered every entry at every recall, about 170 wasm instructions a
// byte: past 5.5 MiB of entries, well within what the sandbox accepts, a
// recall spent its fuel whether anything matched or not, and so did every
// recall after the rebuild. Encoding what matched cost 300 more a byte, so
// four matches of 1 MiB stopped it too. kv now lowers once, at the store,
// holds at most 6 MiB, and the guest library keeps an answer to
// abi.RecallAnswerBytes.
func TestKVRecallsAtTheBounds(t *testing.T) {
	ts := newKVServer(t)
	ctx := context.Background()
	// Mixed case, and a query's first byte ("e") every ten bytes: the
	// search's slowest path.
	body := strings.Repeat("Memory Of Something ", 1<<20/20+1)
	const n = 6
	size := 1<<20 - 8
	for i := range n {
		content := (fmt.Sprintf("Entry%02d ", i) + body)[:size]
		if err := store(t, ts, fmt.Sprintf("e%02d", i), content); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	err := store(t, ts, "one-too-many", body[:1<<10])
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "forget some first") {
		t.Fatalf("a store past kv's bound: %v", err)
	}
	if got := recallKeys(t, ts, "absent", 10); len(got) != 0 {
		t.Fatalf("recall of nothing: %v", got)
	}
	if got := recallKeys(t, ts, "entry03", 10); strings.Join(got, ",") != "e03" {
		t.Fatalf("recall of one, case folded: %v", got)
	}
	got, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: "SOMETHING", Limit: 100})
	if err != nil {
		t.Fatalf("recall of every entry: %v", err)
	}
	if len(got.Entries) != 1 || got.Entries[0].Key != fmt.Sprintf("e%02d", n-1) || len(got.Entries[0].Content) != size {
		t.Fatalf("recall of every entry: %d entries, the first %q (an answer holds %d bytes)", len(got.Entries), got.Entries[0].GetKey(), abi.RecallAnswerBytes)
	}
	if got := recallKeys(t, ts, "memory", 100); len(got) != 1 {
		t.Fatalf("recall of every entry again: %v", got)
	}
	// Forgetting makes room.
	if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "e00"}); err != nil {
		t.Fatal(err)
	}
	if err := store(t, ts, "one-more", body[:1<<10]); err != nil {
		t.Fatalf("a store after a forget: %v", err)
	}
	if n := ts.logs.FilterMessage("rebuilding the memory plugin's instance with its entries").Len(); n != 0 {
		t.Fatalf("the instance was rebuilt %d times", n)
	}
}

// kv's search was strings.Contains, which on wasm compares the whole
// query wherever its first two bytes match until its failures pass one
// in sixteen bytes, then goes on with Rabin-Karp under a fixed, public
// hash. Two queries ran kv out of fuel within its own 6 MiB, each recall
// stopping the instance: one of 193 bytes repeating the content's period
// of sixteen (compared in full at every period), and one whose hash is
// that of every window of the content (compared at every byte). kv's
// search is now linear whatever the query: the compares have a budget,
// and its Rabin-Karp draws its hash at random.
func TestKVRecallWhateverTheQuery(t *testing.T) {
	ts := newKVServer(t)
	ctx := context.Background()
	period := "abcccccccccccccc"
	colliding := goHashCollision("m", 64)
	if goHash(colliding) != goHash(strings.Repeat("m", len(colliding))) || colliding == strings.Repeat("m", len(colliding)) {
		t.Fatalf("%q does not collide", colliding)
	}
	for _, c := range []struct{ name, unit, query string }{
		{"a period of sixteen", period, strings.Repeat(period, 12) + "x"},
		{"every window's hash", "m", colliding},
	} {
		content := strings.Repeat(c.unit, (1<<20-8)/len(c.unit))
		for i := range 6 {
			if err := store(t, ts, fmt.Sprintf("e%d", i), content); err != nil {
				t.Fatalf("%s: store %d: %v", c.name, i, err)
			}
		}
		got, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: c.query, Limit: 10})
		if err != nil || len(got.Entries) != 0 {
			t.Fatalf("%s: recall: %v %v", c.name, got, err)
		}
		// The query found where it is.
		if err := store(t, ts, "e0", content[:1<<19]+c.query+content[1<<19:len(content)-len(c.query)]); err != nil {
			t.Fatal(err)
		}
		if got := recallKeys(t, ts, c.query, 10); strings.Join(got, ",") != "e0" {
			t.Fatalf("%s: recall of the one that holds it: %v", c.name, got)
		}
	}
	if n := ts.logs.FilterMessage("rebuilding the memory plugin's instance with its entries").Len(); n != 0 {
		t.Fatalf("the instance was rebuilt %d times", n)
	}
}

// kv holds 6 MiB whatever plugins.limits.call_fuel is, and searched all
// of it at every recall, up to 0.38 x 10^9 units for a query shaped
// against its content: under a call_fuel of 2.5 x 10^8 such a recall ran
// out of fuel, stopping the instance, and the sandbox rebuilt it, every
// entry stored again, at every such recall. kv now searches newest first,
// stops at its answer, and checks the fuel left (the fuel_left import)
// before each entry: what the budget cannot search fails with kv's own
// error, the instance kept, and forgetting brings the rest within it.
func TestKVRecallWithinALowerCallFuel(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "kv")
	lim := wasmhost.DefaultLimits()
	lim.CallFuel = 250_000_000
	ts := newTestServerLimits(t, dir, lim)
	ctx := context.Background()
	period := "abcccccccccccccc"
	shaped := strings.Repeat(period, 12) + "x" // compared in full at every period
	fill := strings.Repeat(period, 1<<18/len(period))
	const n = 24 // of 256 KiB: kv's 6 MiB
	for i := range n {
		if err := store(t, ts, fmt.Sprintf("e%02d", i), (fmt.Sprintf("Entry%02d something ", i) + fill)[:1<<18-16]); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	if got := recallKeys(t, ts, "something", 1); strings.Join(got, ",") != "e23" {
		t.Fatalf("recall of the newest: %v", got)
	}
	if got := recallKeys(t, ts, "entry20", 10); strings.Join(got, ",") != "e20" {
		t.Fatalf("recall of the fourth newest: %v", got)
	}
	_, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: shaped, Limit: 10})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "forget some entries or raise it") {
		t.Fatalf("a recall past the budget: %v", err)
	}
	t.Log(err)
	if n := ts.logs.FilterMessage("rebuilding the memory plugin's instance with its entries").Len(); n != 0 {
		t.Fatalf("the instance was rebuilt %d times", n)
	}
	for i := range 14 {
		if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: fmt.Sprintf("e%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := recallKeys(t, ts, shaped, 10); len(got) != 0 {
		t.Fatalf("the same recall over what is left: %v", got)
	}
	// Every entry left matches: the answer is the newest, as many as the
	// budget can answer, then the size of an answer (three of 256 KiB).
	got := recallKeys(t, ts, "something", 100)
	if len(got) == 0 || len(got) > 3 {
		t.Fatalf("recall of every entry left: %v", got)
	}
	for i, k := range got {
		if k != fmt.Sprintf("e%02d", n-1-i) {
			t.Fatalf("recall of every entry left, not newest first: %v", got)
		}
	}
	t.Logf("%d entries of 256 KiB answered", len(got))
}

// kv keeps its entries in store order and skips, at a recall, those
// replaced or forgotten since, until they are more than half and it
// compacts: a replaced entry's old content and a forgotten entry are
// never found, before or after the compaction, and a replaced key ranks
// as new.
func TestKVRecallsOnlyLiveEntries(t *testing.T) {
	ts := newKVServer(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if err := store(t, ts, k, "old note "+k); err != nil {
			t.Fatal(err)
		}
	}
	if err := store(t, ts, "a", "new note a"); err != nil { // a replaced: 4 stored, 3 live
		t.Fatal(err)
	}
	if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "b"}); err != nil { // 4 stored, 2 live
		t.Fatal(err)
	}
	check := func(when, order string) {
		t.Helper()
		if got := recallKeys(t, ts, "note", 10); strings.Join(got, ",") != order {
			t.Fatalf("%s: recall of every entry: %v", when, got)
		}
		if got := recallKeys(t, ts, "old note a", 10); len(got) != 0 {
			t.Fatalf("%s: a replaced entry's old content found: %v", when, got)
		}
		if got := recallKeys(t, ts, "note b", 10); len(got) != 0 {
			t.Fatalf("%s: a forgotten entry found: %v", when, got)
		}
	}
	check("before compacting", "a,c")
	if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "c"}); err != nil { // 4 stored, 1 live: compacted
		t.Fatal(err)
	}
	if err := store(t, ts, "c", "old note c"); err != nil {
		t.Fatal(err)
	}
	check("after compacting", "c,a") // c stored again, the newest
}

// goHash is strings.Index's Rabin-Karp hash of s.
func goHash(s string) uint32 {
	var h uint32
	for i := 0; i < len(s); i++ {
		h = h*16777619 + uint32(s[i])
	}
	return h
}

// goHashCollision is prefix repeated to n bytes, then eight lower-case
// letters, whose hash under strings.Index's Rabin-Karp (h = h*16777619 +
// b, modulo 2^32) is that of prefix repeated to n+8 bytes: the eight
// letters' differences from it, d, meet sum d[j]*16777619^(7-j) = 0
// modulo 2^32, found by meeting in the middle.
func goHashCollision(prefix string, n int) string {
	const prime = 16777619
	p := byte(prefix[0])
	lo, hi := byte('a')-p, byte('z')-p // as int8 below
	span := int(int8(hi)) - int(int8(lo)) + 1
	pow := [8]uint32{1}
	for j := 1; j < 8; j++ {
		pow[j] = pow[j-1] * prime
	}
	// half sums the differences of four letters at positions of weights
	// pow[w..w+3], the four coded in base span.
	half := func(code, w int) (uint32, [4]int) {
		var sum uint32
		var d [4]int
		for k := range 4 {
			d[k] = code%span + int(int8(lo))
			code /= span
			sum += uint32(int32(d[k])) * pow[w+k]
		}
		return sum, d
	}
	total := span * span * span * span
	low := make(map[uint32]int, total)
	for code := range total {
		sum, _ := half(code, 0)
		low[sum] = code
	}
	for code := range total {
		sum, dh := half(code, 4)
		lc, ok := low[-sum]
		if !ok {
			continue
		}
		_, dl := half(lc, 0)
		if dh == [4]int{} && dl == [4]int{} {
			continue
		}
		// pow[7] weighs the first letter: the high half comes first.
		b := []byte(strings.Repeat(prefix, n)[:n])
		for k := 3; k >= 0; k-- {
			b = append(b, byte(int(p)+dh[k]))
		}
		for k := 3; k >= 0; k-- {
			b = append(b, byte(int(p)+dl[k]))
		}
		return string(b)
	}
	panic("no collision")
}

// A 1 MiB entry of Cyrillic text cost kv 577 million units of fuel to
// store, most of it strings.ToLower (about 1,300 units a rune), and
// stored again, as an update of the same key, it ran out of fuel: every
// time, each time rebuilding the instance. kv lowers through its own
// table now, about 96 million a store.
func TestKVStoresCyrillicAgain(t *testing.T) {
	ts := newKVServer(t)
	content := strings.Repeat("ПРИВЕТ мир ", (1<<20)/len("ПРИВЕТ мир "))
	for n := range 3 {
		if err := store(t, ts, "note", content); err != nil {
			t.Fatalf("store %d: %v", n+1, err)
		}
	}
	if got := recallKeys(t, ts, "ПРИВЕТ МИР", 10); strings.Join(got, ",") != "note" {
		t.Fatalf("recall: %v", got)
	}
	if n := ts.logs.FilterMessage("rebuilding the memory plugin's instance with its entries").Len(); n != 0 {
		t.Fatalf("the instance was rebuilt %d times", n)
	}
}

// BenchmarkMemoryStoreText times a store of 1 MiB of text into kv, in
// memory only: the guest's decoding and kv's lowering, which for text
// that is not ASCII went rune by rune through unicode.ToLower.
// benchTexts are the texts the memory benchmarks store and recall, each
// repeated to 1 MiB.
var benchTexts = []struct{ name, unit string }{
	{"ascii", "Plain ASCII text "},
	{"html", "<a href=\"x\">&amp;</a> "},
	{"accented", "Élan vital à Paris "},
	{"cyrillic", "ПРИВЕТ мир "},
	{"greek", "Ωμέγα "},
	{"japanese", "日本語のメモ"},
	{"lines", "a short line of text\n"},
}

func BenchmarkMemoryStoreText(b *testing.B) {
	for _, c := range benchTexts {
		b.Run(c.name, func(b *testing.B) {
			ts := newKVServer(b)
			content := strings.Repeat(c.unit, (1<<20)/len(c.unit))
			b.SetBytes(int64(len(content)))
			ctx := context.Background()
			for b.Loop() {
				if _, err := ts.MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Entry: &pluginv1.MemoryEntry{Key: "k", Content: content}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMemoryRecallText recalls one entry of 1 MiB through the
// sandbox: the guest's search finds it at once, and most of the call is
// the guest library's encoding of the answer.
func BenchmarkMemoryRecallText(b *testing.B) {
	for _, c := range benchTexts {
		b.Run(c.name, func(b *testing.B) {
			ts := newKVServer(b)
			content := strings.Repeat(c.unit, (1<<20)/len(c.unit))
			if err := store(b, ts, "k", content); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(content)))
			benchRecall(b, ts, strings.Fields(c.unit)[0], 1) // found at once, whole runes
		})
	}
}

// benchRecall times recalls of query, each answered with want entries.
func benchRecall(b *testing.B, ts *testServer, query string, want int) {
	ctx := context.Background()
	for b.Loop() {
		got, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: query, Limit: 10})
		if err != nil || len(got.Entries) != want {
			b.Fatal(got, err)
		}
	}
}

// BenchmarkMemoryRecallMany searches what kv holds as many small entries
// (10,000 of 600 bytes, 6 MiB) for a word none has: every entry is
// searched, newest first, each checked against the call's fuel.
func BenchmarkMemoryRecallMany(b *testing.B) {
	ts := newKVServer(b)
	const n, size = 10_000, 600
	line := strings.Repeat("a short line of text, ", size/22+1)
	for i := range n {
		if err := store(b, ts, fmt.Sprintf("entry-%05d", i), line[:size-11]); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(n * size)
	benchRecall(b, ts, "absent", 0)
}

// A store decoded its entry with encoding/json, about 725 wasm
// instructions of fuel a byte, and the host escaped <, > and & to six
// bytes each: 512 KiB of "<a&b>" ran out of fuel, and with kv lowering at
// the store, so did 1 MiB of accented text. fastjson's unescaping then
// spent about 1,200 units an escape under a meter that charged Go's
// dispatch blocks (4,200 a \u00XX): 256 KiB of control characters ran out
// of fuel. Entries of the content bound, 1 MiB, of any of these now store
// and are recalled, with kv's own lowering (two-byte runes by a table,
// runes whose lower case is longer or shorter) found by an upper-case
// query.
func TestKVStoresWhatTheSandboxAccepts(t *testing.T) {
	ts := newKVServer(t)
	for i, unit := range []string{"plain ascii text ", "日本語のメモ", "Élan vital à Paris ", "<a href=\"x\">&amp;</a> ", "tab\tand\nnewline ", "\x01\x02\x1f", "\"quoted\"\n", "ПРИВЕТ мир ", "Ⱥİ ΩẞK "} {
		content := strings.Repeat(unit, 1<<20/len(unit))
		key := fmt.Sprintf("k%d", i)
		if err := store(t, ts, key, content); err != nil {
			t.Fatalf("store 1 MiB of %q: %v", unit, err)
		}
		query := strings.ToUpper(string([]rune(unit)[:3]))
		got, err := ts.MemoryRecall(context.Background(), &pluginv1.MemoryRecallRequest{Query: query, Limit: 1})
		if err != nil || len(got.Entries) != 1 || got.Entries[0].Key != key || got.Entries[0].Content != content {
			t.Fatalf("recall %q: %v", query, err)
		}
		if _, err := ts.MemoryForget(context.Background(), &pluginv1.MemoryForgetRequest{Key: key}); err != nil {
			t.Fatal(err)
		}
	}
}

// The session service shows a client 1 MiB of a recall, but the sandbox
// sent it the whole answer, up to its 16 MiB message, across the socket.
// Given the room shown (answer_limit), the sandbox sends that start of
// the recall tool's answer and the whole's size: the reply's size as a
// gRPC message is counted. Without answer_limit (a session service older
// than the field) it still sends the entries. The guest library keeps an
// answer to 1 MiB past its first entry, which it always keeps; kv here
// answers one entry of 6 MiB, as a plugin may.
func TestRecallAnswersOnlyWhatIsShown(t *testing.T) {
	dir := t.TempDir()
	if err := guestbuild.Install(dir, "kv"); err != nil {
		t.Fatal(err)
	}
	replaceKV(t, dir, "testhooks.go", `//go:build wasip1

package main

import (
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

type big struct{ kv }

func (big) Recall(string, int) ([]memory.Entry, error) {
	return []memory.Entry{{Key: "big", Content: strings.Repeat("x", 6<<20)}}, nil
}

func init() { memory.Register(big{}) } // after main.go's init
`)
	ts := newTestServer(t, dir)
	ctx := context.Background()
	old, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: "x", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(old.GetEntries()) != 1 || old.GetAnswerBytes() != 0 {
		t.Fatalf("recall without answer_limit: %d entries, answer_bytes %d; want the entry", len(old.GetEntries()), old.GetAnswerBytes())
	}
	whole, total, err := recallanswer.Build(ctx, old.GetEntries(), math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	const room = 1 << 20
	got, err := ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: "x", Limit: 10, AnswerLimit: room})
	if err != nil {
		t.Fatal(err)
	}
	if size := proto.Size(got); size > room+64 {
		t.Fatalf("the reply to a recall shown %d bytes is %d bytes (the whole answer %d)", room, size, total)
	}
	if len(got.GetEntries()) != 0 || got.GetAnswerBytes() != int64(total) || total != len(whole) ||
		!strings.HasPrefix(whole, got.GetAnswer()) || len(got.GetAnswer()) < room-5 {
		t.Fatalf("answer of %d bytes, answer_bytes %d, %d entries; want the start of the whole %d-byte answer",
			len(got.GetAnswer()), got.GetAnswerBytes(), len(got.GetEntries()), total)
	}
}

// A plugin tool's output went to the session service whole, up to the
// host's 16 MiB result, to be cut there to the 1 MiB a client is shown.
// Given the room shown (output_limit), the sandbox sends that start, cut
// at a character, and the whole's size; the reply's size as a gRPC
// message is counted. Without it (an older session service) the output
// is sent whole.
func TestToolOutputSentOnlyAsFarAsItIsShown(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "echo")
	ts := newTestServer(t, dir)
	ctx := context.Background()
	text := strings.Repeat("é", 3<<18) + "x" // 1.5 MiB, a character across the cut
	args := `{"text":"` + text + `"}`
	whole, err := ts.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "wasm_echo", ArgumentsJson: args})
	if err != nil || whole.GetOutput() != text || whole.GetOutputBytes() != 0 {
		t.Fatalf("a call without output_limit: %d bytes, output_bytes %d, %q %v; want the output whole",
			len(whole.GetOutput()), whole.GetOutputBytes(), whole.GetError(), err)
	}
	const room = 1<<20 + 1 // within an "é"
	got, err := ts.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "wasm_echo", ArgumentsJson: args, OutputLimit: room})
	if err != nil {
		t.Fatal(err)
	}
	if size := proto.Size(got); size > room+64 {
		t.Fatalf("the reply to a call shown %d bytes is %d bytes (the output %d)", room, size, len(text))
	}
	if got.GetOutput() != text[:room-1] || got.GetOutputBytes() != int64(len(text)) || !got.GetSuccess() {
		t.Fatalf("output of %d bytes, output_bytes %d; want the %d bytes before the cut character and %d",
			len(got.GetOutput()), got.GetOutputBytes(), room-1, len(text))
	}
}
