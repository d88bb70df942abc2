package pluginsandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

func withMemoryDir(dir string) func(*pluginsandbox.Config) {
	return func(c *pluginsandbox.Config) { c.MemoryDir = dir }
}

// A memory plugin keeps its entries in its instance, and a restart of the
// sandbox (a crash, an upgrade, make up again) lost every memory. Each
// change is now written to a journal under the sandbox's data directory
// before the call answers, and a sandbox that starts gives the plugin its
// entries back, in the order they were stored.
func TestMemoriesOutliveTheSandbox(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	first := newTestServer(t, plugins, withMemoryDir(memories))
	for _, k := range []string{"a", "b", "c", "a"} {
		if err := store(t, first, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if _, err := first.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := store(t, first, "ctl", "note "+strings.Repeat("\x01", 1000)); err != nil {
		t.Fatal(err)
	}

	// A second sandbox on the same directories is one that restarted: its
	// kv instance starts empty.
	second := newTestServer(t, plugins, withMemoryDir(memories))
	if got := recallKeys(t, second, "note", 10); strings.Join(got, ",") != "ctl,a,c" {
		t.Fatalf("recall after a restart, newest first: %v", got)
	}
	got, err := second.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: "\x01"})
	if err != nil || len(got.Entries) != 1 || got.Entries[0].Content != "note "+strings.Repeat("\x01", 1000) {
		t.Fatalf("an entry of control characters: %v %v", got, err)
	}

	// The process stopped while appending: the cut record is dropped and
	// the rest kept.
	path := filepath.Join(memories, "kv.jsonl")
	cut := func() {
		t.Helper()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(`{"op":"store","key":"ZA`); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	cut()
	// And a rewrite cut short left its temporary file.
	if err := os.WriteFile(path+".123", []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	third := newTestServer(t, plugins, withMemoryDir(memories))
	if n := third.logs.FilterMessage("memory journal ended in a record cut short; it is dropped").Len(); n != 1 {
		t.Fatalf("%d warnings of the cut record", n)
	}
	if _, err := os.Stat(path + ".123"); !os.IsNotExist(err) {
		t.Fatalf("the temporary file of a rewrite cut short: %v", err)
	}
	// Another replica, sharing the journal, stopped while appending.
	cut()
	if err := store(t, third, "d", "note d"); err != nil {
		t.Fatal(err)
	}
	fourth := newTestServer(t, plugins, withMemoryDir(memories))
	if got := recallKeys(t, fourth, "note", 10); strings.Join(got, ",") != "d,ctl,a,c" {
		t.Fatalf("recall after a cut record and a store: %v", got)
	}
}

// The journal is a log; it is rewritten with what is live once it has
// doubled, so storing one key again and again does not grow it without
// bound.
func TestMemoryJournalIsBounded(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	ts := newTestServer(t, plugins, withMemoryDir(memories))
	mib := strings.Repeat("m", 1<<20)
	for i := range 12 {
		if err := store(t, ts, "same", mib[:1<<20-i]); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	st, err := os.Stat(filepath.Join(memories, "kv.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// One record is 1.4 MiB as base64; 12 of them were 16.8 MiB.
	if st.Size() > 6<<20 {
		t.Fatalf("the journal holds %d bytes for one entry of 1 MiB", st.Size())
	}
	again := newTestServer(t, plugins, withMemoryDir(memories))
	got, err := again.MemoryRecall(context.Background(), &pluginv1.MemoryRecallRequest{Query: "m"})
	if err != nil || len(got.Entries) != 1 || len(got.Entries[0].Content) != 1<<20-11 {
		t.Fatalf("after the rewrites: %v", err)
	}
}

// A journal that cannot be read fails the plugin's load, naming the file,
// and is left as it is: starting empty would let the next change and a
// restart lose what it held.
func TestMemoryJournalUnreadable(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	path := filepath.Join(memories, "kv.jsonl")
	bad := "{\"op\":\"store\",\"key\":\"YQ==\",\"content\":\"Yg==\"}\nnot json\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, plugins, withMemoryDir(memories))
	p := ts.plugins(t)["kv"]
	if p.GetStatus() == "loaded" || !strings.Contains(p.GetReason(), path) || !strings.Contains(p.GetReason(), "line 2") {
		t.Fatalf("kv with an unreadable journal: %v", p)
	}
	if raw, _ := os.ReadFile(path); string(raw) != bad {
		t.Fatalf("the journal was changed: %q", raw)
	}
}

// BenchmarkMemoryStore times a store of a small entry, with the journal
// (appended and synced before the call answers) and without.
func BenchmarkMemoryStore(b *testing.B) {
	for _, journal := range []bool{false, true} {
		name := "memory-only"
		if journal {
			name = "journal"
		}
		b.Run(name, func(b *testing.B) {
			plugins := b.TempDir()
			installExample(b, plugins, "kv")
			var mut []func(*pluginsandbox.Config)
			if journal {
				mut = append(mut, withMemoryDir(b.TempDir()))
			}
			ts := newTestServer(b, plugins, mut...)
			ctx := context.Background()
			for b.Loop() {
				if _, err := ts.MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Entry: &pluginv1.MemoryEntry{Key: "k", Content: "a note of a hundred bytes or so, as a memory tends to be: short, and stored again"}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Replicas of the sandbox share the journal, each with its own instance.
// One that serves memory calls after another did (the other stopped, or
// a client called it directly) answered from what it had read when it
// started; it now takes what the other recorded first.
func TestMemoryReplicasShareTheJournal(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	one := newTestServer(t, plugins, withMemoryDir(memories))
	two := newTestServer(t, plugins, withMemoryDir(memories))
	if err := store(t, one, "a", "note a"); err != nil {
		t.Fatal(err)
	}
	if got := recallKeys(t, two, "note", 10); strings.Join(got, ",") != "a" {
		t.Fatalf("replica two after a store on one: %v", got)
	}
	if err := store(t, two, "b", "note b"); err != nil {
		t.Fatal(err)
	}
	if _, err := two.MemoryForget(context.Background(), &pluginv1.MemoryForgetRequest{Key: "a"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := recallKeys(t, one, "note", 10); strings.Join(got, ",") != "b" {
			t.Fatalf("replica one after a store and a forget on two: %v", got)
		}
	}
	// Each was given the other's changes, not rebuilt with every entry.
	if n := rebuilds(one); n != 0 {
		t.Fatalf("replica one rebuilt its instance %d times", n)
	}
	if n := rebuilds(two); n != 0 {
		t.Fatalf("replica two rebuilt its instance %d times", n)
	}
}

func rebuilds(ts *testServer) int {
	return ts.logs.FilterMessage("rebuilding the memory plugin's instance with its entries").Len()
}

// A replica that found the journal changed by another rebuilt its
// instance and stored every entry in it again, 0.45 s at the bounds, at
// its first call after any change. It now gives its instance only the
// changes: the records appended since it last read, or, after a rewrite,
// forgets and stores, when they give the order a rebuild would.
func TestMemoryReplicaGivenOnlyTheChanges(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	one := newTestServer(t, plugins, withMemoryDir(memories))
	two := newTestServer(t, plugins, withMemoryDir(memories))
	path := filepath.Join(memories, "kv.jsonl")
	inode := func() uint64 {
		t.Helper()
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}
	check := func(step, want string, wantRebuilds int) {
		t.Helper()
		if got := strings.Join(recallKeys(t, two, "note", 10), ","); got != want {
			t.Fatalf("%s: replica two recalls %s, want %s", step, got, want)
		}
		if n := rebuilds(two); n != wantRebuilds {
			t.Fatalf("%s: replica two rebuilt its instance %d times, want %d", step, n, wantRebuilds)
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		if err := store(t, one, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	check("three stores appended", "c,b,a", 0)

	// A store past 1 MiB rewrites the journal: a new file.
	big := strings.Repeat("x", 1_000_000)
	before := inode()
	if err := store(t, one, "big1", "huge "+big); err != nil {
		t.Fatal(err)
	}
	if inode() == before {
		t.Fatal("the journal was not rewritten")
	}
	check("a rewrite after a store", "c,b,a", 0)
	if got := strings.Join(recallKeys(t, two, "huge", 10), ","); got != "big1" {
		t.Fatalf("replica two recalls %q after the rewrite", got)
	}

	// Stored again as it was: the newest all the same.
	if err := store(t, one, "a", "note a"); err != nil {
		t.Fatal(err)
	}
	check("an entry stored again", "a,c,b", 0)

	// b stored again, then a rewrite: the entries two holds alike are no
	// longer first in the journal's order, and only a rebuild gives it.
	before = inode()
	if err := store(t, one, "b", "note b"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"big2", "big3"} {
		if err := store(t, one, k, "huge "+big); err != nil {
			t.Fatal(err)
		}
	}
	if inode() == before {
		t.Fatal("the journal was not rewritten")
	}
	check("a rewrite after an entry stored again", "b,a,c", 1)
	for _, k := range []string{"big1", "big2", "big3"} {
		got, err := two.MemoryForget(context.Background(), &pluginv1.MemoryForgetRequest{Key: k})
		if err != nil || !got.Existed {
			t.Fatalf("forget %s on replica two: %v %v", k, got, err)
		}
	}
	if got := strings.Join(recallKeys(t, one, "huge", 10), ","); got != "" || rebuilds(one) != 0 {
		t.Fatalf("replica one after two forgot the large entries: %q, %d rebuilds", got, rebuilds(one))
	}
}

// BenchmarkMemoryReplicaCatchUp times a store on one replica and the call
// after it on another, the two sharing a journal of MaxMemoryEntries
// entries (4 MiB of them in four, the rest 100 bytes each, as
// BenchmarkMemoryRebuild's).
func BenchmarkMemoryReplicaCatchUp(b *testing.B) {
	plugins, memories := b.TempDir(), b.TempDir()
	installTestKV(b, plugins)
	var journal bytes.Buffer
	enc := json.NewEncoder(&journal)
	record := func(key, content string) {
		if err := enc.Encode(map[string]any{"op": "store", "key": []byte(key), "content": []byte(content)}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range pluginsandbox.MaxMemoryEntries - 4 {
		record(fmt.Sprintf("s%05d", i), strings.Repeat("s", 100))
	}
	for i := range 4 {
		record(fmt.Sprintf("big%d", i), strings.Repeat("z", 1<<20))
	}
	if err := os.WriteFile(filepath.Join(memories, "kv.jsonl"), journal.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	one := newTestServer(b, plugins, withMemoryDir(memories))
	two := newTestServer(b, plugins, withMemoryDir(memories))
	ctx := context.Background()
	absent := &pluginv1.MemoryForgetRequest{Key: "absent"}
	for _, ts := range []*testServer{one, two} { // each instance given the entries
		if _, err := ts.MemoryForget(ctx, absent); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		i++
		if err := store(b, one, fmt.Sprintf("s%05d", i%100), strings.Repeat("t", 100)); err != nil {
			b.Fatal(err)
		}
		if _, err := two.MemoryForget(ctx, absent); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n := rebuilds(two); n != 1 {
		b.Fatalf("replica two rebuilt its instance %d times", n)
	}
}

// The memory folder removed under a running sandbox (its data directory
// wiped): the journal's folder is made again with the entries held
// (TestJournalFolderRemoved), but a call found the journal changed first,
// read it to catch up, and failed as "memory journal unreadable" on the
// missing folder; every store, forget and recall failed so until a
// restart, which found the folder empty. Now the catch-up makes the
// folder again with what the ledger holds, and the call goes on.
func TestMemoryFolderRemovedWhileRunning(t *testing.T) {
	plugins, memories := t.TempDir(), filepath.Join(t.TempDir(), "memories")
	installExample(t, plugins, "kv")
	ts := newTestServer(t, plugins, withMemoryDir(memories))
	for _, k := range []string{"a", "b"} {
		if err := store(t, ts, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(memories); err != nil {
		t.Fatal(err)
	}
	if got := recallKeys(t, ts, "note", 10); strings.Join(got, ",") != "b,a" {
		t.Fatalf("recall after the folder was removed: %v", got)
	}
	if err := store(t, ts, "c", "note c"); err != nil {
		t.Fatalf("store after the folder was removed: %v", err)
	}
	again := newTestServer(t, plugins, withMemoryDir(memories))
	if got := recallKeys(t, again, "note", 10); strings.Join(got, ",") != "c,b,a" {
		t.Fatalf("recall after a restart: %v", got)
	}
}

// A forget whose record the journal refused (full, its rewrite failing)
// answers that the change would not outlive a restart, and to retry. The
// retry found the entry in neither the ledger nor the instance, wrote
// nothing and answered success, and a restart brought the entry back.
// Now the ledger keeps the entry while the journal does, so the retry
// writes the forget.
func TestMemoryForgetRetriedIsWritten(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	ts := newTestServer(t, plugins, withMemoryDir(memories))
	for _, k := range []string{"a", "b"} {
		if err := store(t, ts, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(filepath.Join(memories, "kv.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	pluginsandbox.SetMemoryJournal(ts.Server, "kv", st.Size(), func(string, string) (*os.File, error) {
		return nil, errors.New("refused by the test")
	})
	ctx := context.Background()
	_, err = ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "a"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("forget with the journal full: %v", err)
	}
	pluginsandbox.SetMemoryJournal(ts.Server, "kv", st.Size()+1<<20, os.CreateTemp)
	if _, err := ts.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Key: "a"}); err != nil {
		t.Fatalf("the forget retried: %v", err)
	}
	again := newTestServer(t, plugins, withMemoryDir(memories))
	if got := recallKeys(t, again, "note", 10); strings.Join(got, ",") != "b" {
		t.Fatalf("recall after a restart: %v", got)
	}
}

// A plugin loaded again by a rescan took the entries of the load it
// replaced over those its own load read from the journal: an entry
// another replica forgot since the old load last read the journal came
// back on this replica, and its instance was given it again. With a
// journal, the new load now keeps what it read, which holds every change
// the old load recorded, and catches up on later ones from the journal.
func TestMemoryReloadKeepsAnotherReplicasForget(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	one := newTestServer(t, plugins, withMemoryDir(memories))
	two := newTestServer(t, plugins, withMemoryDir(memories))
	for _, k := range []string{"a", "b"} {
		if err := store(t, one, k, "note "+k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := two.MemoryForget(context.Background(), &pluginv1.MemoryForgetRequest{Key: "a"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(plugins, "kv", "manifest.toml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\n# edited\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	one.rescan(t)
	if got := recallKeys(t, one, "note", 10); strings.Join(got, ",") != "b" {
		t.Fatalf("replica one after two forgot a and one reloaded kv: %v", got)
	}
	if err := store(t, one, "c", "note c"); err != nil {
		t.Fatal(err)
	}
	if got := recallKeys(t, one, "note", 10); strings.Join(got, ",") != "c,b" {
		t.Fatalf("replica one after a store on the new load: %v", got)
	}
}

// Two replicas share the memory folder, and it is removed (a data
// directory wiped) and made again by the one that calls first, with the
// entries it holds. What the other recorded that the first had not read
// was lost: the other read the made-again journal at its next call and
// forgot it too, and a restart found none of it. Now the first writes
// into the new journal what others appended to the file it last read,
// and a replica that finds the folder made again by another writes its
// entries the new journal lacks into it.
func TestMemoryFolderRemadeKeepsAnotherReplicasChanges(t *testing.T) {
	big := strings.Repeat("x", 1_000_000)
	for _, tc := range []struct {
		name string
		// run makes the changes on the two replicas and removes the
		// folder; first is the one that calls first after.
		run  func(t *testing.T, one, two *testServer, rm func())
		want string // sorted keys of the entries kept
	}{
		{"appended, not read", func(t *testing.T, one, two *testServer, rm func()) {
			mustStore(t, one, "a")
			mustStore(t, two, "b")
			rm()
		}, "a,b,c"},
		{"a forget, not read", func(t *testing.T, one, two *testServer, rm func()) {
			mustStore(t, one, "a")
			mustStore(t, one, "z")
			recallKeys(t, two, "note", 10)
			if _, err := one.MemoryForget(context.Background(), &pluginv1.MemoryForgetRequest{Key: "z"}); err != nil {
				t.Fatal(err)
			}
			rm()
			// Two finds the folder gone first this time.
			mustStore(t, two, "b")
		}, "a,b,c"},
		{"after a rewrite, not read", func(t *testing.T, one, two *testServer, rm func()) {
			mustStore(t, one, "a")
			if err := store(t, two, "big", "note "+big); err != nil { // a rewrite: a new file
				t.Fatal(err)
			}
			mustStore(t, two, "b")
			rm()
		}, "a,b,big,c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plugins, memories := t.TempDir(), filepath.Join(t.TempDir(), "memories")
			installExample(t, plugins, "kv")
			one := newTestServer(t, plugins, withMemoryDir(memories))
			two := newTestServer(t, plugins, withMemoryDir(memories))
			tc.run(t, one, two, func() {
				if err := os.RemoveAll(memories); err != nil {
					t.Fatal(err)
				}
			})
			mustStore(t, one, "c")
			sorted := func(ts *testServer) string {
				keys := recallKeys(t, ts, "note", 10)
				slices.Sort(keys)
				return strings.Join(keys, ",")
			}
			if got := sorted(two); got != tc.want {
				t.Fatalf("replica two after the folder was made again: %s, want %s", got, tc.want)
			}
			if got := sorted(one); got != tc.want {
				t.Fatalf("replica one after two's next call: %s, want %s", got, tc.want)
			}
			if got := sorted(newTestServer(t, plugins, withMemoryDir(memories))); got != tc.want {
				t.Fatalf("after a restart: %s, want %s", got, tc.want)
			}
		})
	}
}

func mustStore(t *testing.T, ts *testServer, key string) {
	t.Helper()
	if err := store(t, ts, key, "note "+key); err != nil {
		t.Fatalf("store %s: %v", key, err)
	}
}

// A journal file deleted under running replicas, its folder kept (by
// `plugin remove --purge`, or by hand), empties the plugin's memory on
// every replica, as a purge means to. It did so without a word: the
// next call found an empty journal and forgot every entry. Each replica
// now says so, with how many entries went.
func TestMemoryJournalDeletedIsSaid(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	one := newTestServer(t, plugins, withMemoryDir(memories))
	two := newTestServer(t, plugins, withMemoryDir(memories))
	for _, k := range []string{"a", "b"} {
		mustStore(t, one, k)
	}
	recallKeys(t, two, "note", 10)
	if err := os.Remove(filepath.Join(memories, "kv.jsonl")); err != nil {
		t.Fatal(err)
	}
	for i, ts := range []*testServer{one, two} {
		if got := recallKeys(t, ts, "note", 10); len(got) != 0 {
			t.Fatalf("replica %d after its journal was deleted: %v", i+1, got)
		}
		said := ts.logs.FilterMessageSnippet("memory journal").FilterMessageSnippet("entries are dropped").All()
		if len(said) != 1 || said[0].ContextMap()["entries"] != int64(2) {
			t.Fatalf("replica %d said %v of the entries dropped", i+1, said)
		}
	}
}

// Two replicas one entry short of MaxMemoryEntries store a new key each
// at once: each checked the bound against the entries it held, and the
// journal came to hold one past it (a restart loaded 10,001). The bound
// now holds across replicas: the store that would pass it, checked under
// the journal's lock against what the file holds, is refused.
func TestMemoryBoundsHoldAcrossReplicas(t *testing.T) {
	plugins, memories := t.TempDir(), t.TempDir()
	installExample(t, plugins, "kv")
	path := filepath.Join(memories, "kv.jsonl")
	var journal bytes.Buffer
	enc := json.NewEncoder(&journal)
	for i := range pluginsandbox.MaxMemoryEntries - 1 {
		if err := enc.Encode(map[string]any{"op": "store", "key": []byte(fmt.Sprintf("s%05d", i)), "content": []byte("s")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, journal.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	one := newTestServer(t, plugins, withMemoryDir(memories))
	two := newTestServer(t, plugins, withMemoryDir(memories))
	var twoErr error
	fired := false
	// Two's store lands between one's catch-up and its own store.
	undo := pluginsandbox.SetMemoryCallHook(func() {
		if !fired {
			fired = true
			twoErr = store(t, two, "from-two", "unique two")
		}
	})
	oneErr := store(t, one, "from-one", "unique one")
	undo()
	if twoErr != nil {
		t.Fatalf("replica two's store, the last under the bound: %v", twoErr)
	}
	if status.Code(oneErr) != codes.ResourceExhausted || !strings.Contains(oneErr.Error(), fmt.Sprint(pluginsandbox.MaxMemoryEntries)) {
		t.Fatalf("replica one's store, past the bound: %v", oneErr)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, line := range bytes.Split(bytes.TrimSpace(raw), []byte("\n")) {
		var r struct {
			Op  string `json:"op"`
			Key []byte `json:"key"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		live[string(r.Key)] = r.Op == "store"
		if r.Op != "store" {
			delete(live, string(r.Key))
		}
	}
	if len(live) != pluginsandbox.MaxMemoryEntries || live["from-one"] {
		t.Fatalf("the journal holds %d entries (from-one: %v), the bound is %d", len(live), live["from-one"], pluginsandbox.MaxMemoryEntries)
	}
	// Replica one's instance does not hold the entry it was refused.
	for _, ts := range []*testServer{one, two} {
		if got := strings.Join(recallKeys(t, ts, "unique", 10), ","); got != "from-two" {
			t.Fatalf("recall after the refused store: %s, want from-two", got)
		}
	}
}
