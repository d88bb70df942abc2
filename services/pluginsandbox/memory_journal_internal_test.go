package pluginsandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// A rewrite that kept failing (a directory that refuses the new file, a
// disk that refuses its write) was tried again at every append past the
// first failure, each try reading the whole file, and the file grew past
// maxJournalBytes, which a load refuses to read; once past it, a rewrite
// that worked again was made from the part it had read, and the records
// after it were lost. Now a failed rewrite waits for the file to grow by
// a quarter (or for retryBackoff), an append that would take the file
// past the bound is refused, and no record answered as written is lost.
// (On the code before: 78 tries over 80 appends, the file past the bound
// from the 36th, and k3 loaded as its 31st append's version where the
// 79th had been answered as written.)
func TestJournalRewriteFailing(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	// A smaller bound than maxJournalBytes, for the test's time (72 MiB
	// took 17 s with the race detector on).
	j.limit = 12 << 20
	tries, failing := 0, true
	j.createTemp = func(dir, pattern string) (*os.File, error) {
		tries++
		if failing {
			return nil, errors.New("refused by the test")
		}
		return os.CreateTemp(dir, pattern)
	}
	size := func() int64 {
		t.Helper()
		st, err := os.Stat(j.path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	// Four keys stored again and again, 256 KiB each (342 KiB a record):
	// what is live stays under 1.4 MiB, far under the bound.
	latest := map[string]string{}
	content := func(i int) string { return fmt.Sprintf("%05d", i) + strings.Repeat("m", 256<<10) }
	written, refused := 0, 0
	for i := 0; i < 80 && refused == 0; i++ {
		key := fmt.Sprintf("k%d", i%4)
		err := j.append(journalRecord{Op: opStore, Key: []byte(key), Content: []byte(content(i))})
		switch {
		case err == nil:
			written++
			latest[key] = content(i)
		case strings.Contains(err.Error(), "full"):
			refused++
		default:
			t.Fatalf("append %d: %v", i, err)
		}
		if s := size(); s > j.limit {
			t.Fatalf("after %d appends the journal holds %d bytes, past the %d a load reads", i+1, s, j.limit)
		}
	}
	if refused == 0 {
		t.Fatalf("%d appends, none refused at %d bytes", written, size())
	}
	// Tried once the file passed 1 MiB, then after each further MiB
	// until a quarter is more: 9 tries on the way to 12 MiB.
	t.Logf("%d appends written, the next refused at %d bytes; %d tries of the rewrite", written, size(), tries)
	if tries > 10 {
		t.Fatalf("%d tries of a failing rewrite over %d appends", tries, written)
	}

	// The directory takes new files again; once the backoff has passed,
	// the next append rewrites the journal to make room for itself.
	failing = false
	j.retryTime = time.Now()
	if err := j.append(journalRecord{Op: opStore, Key: []byte("k0"), Content: []byte(content(100))}); err != nil {
		t.Fatalf("append after the rewrite works again: %v", err)
	}
	latest["k0"] = content(100)
	if s := size(); s > 2<<20 {
		t.Fatalf("rewritten, the journal still holds %d bytes", s)
	}

	again, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	again.limit = j.limit
	l := newLedger(again)
	if _, err := again.load(l); err != nil {
		t.Fatal(err)
	}
	if len(l.entries) != len(latest) {
		t.Fatalf("%d entries loaded, %d written", len(l.entries), len(latest))
	}
	for k, want := range latest {
		if got := l.entries[k].e.Content; got != want {
			t.Fatalf("%s: loaded version %q, last written %q", k, got[:5], want[:5])
		}
	}
}

// BenchmarkJournalUpdateAfterARewrite times what a replica reads when
// another rewrote the journal, MaxMemoryEntries entries of 100 bytes and
// four of 1 MiB: the whole file, and the changes it finds (one store).
func BenchmarkJournalUpdateAfterARewrite(b *testing.B) {
	dir := b.TempDir()
	w, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	var records []journalRecord
	for i := range MaxMemoryEntries - 4 {
		records = append(records, storeRecord(wasmhost.MemoryEntry{Key: fmt.Sprintf("s%05d", i), Content: strings.Repeat("s", 100)}))
	}
	for i := range 4 {
		records = append(records, storeRecord(wasmhost.MemoryEntry{Key: fmt.Sprintf("big%d", i), Content: strings.Repeat("z", 1<<20)}))
	}
	if err := w.append(records...); err != nil {
		b.Fatal(err)
	}
	r, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	have := newLedger(r)
	if _, err := r.load(have); err != nil {
		b.Fatal(err)
	}
	if err := w.append(storeRecord(wasmhost.MemoryEntry{Key: "new", Content: "a note"})); err != nil {
		b.Fatal(err)
	}
	f, err := w.lockedFile(os.O_RDWR)
	if err != nil {
		b.Fatal(err)
	}
	err = w.rewrite(f)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	entries, seq, bytes, seen := have.entries, have.seq, have.bytes, r.seen
	for b.Loop() {
		have.entries = maps.Clone(entries)
		have.seq, have.bytes, r.seen = seq, bytes, seen
		ops, exact, err := r.update(have)
		if err != nil || !exact || len(ops) != 1 || string(ops[0].Key) != "new" {
			b.Fatalf("%d changes (exact %v): %v", len(ops), exact, err)
		}
	}
}

// A journal line is decoded without encoding/json when it is written as
// the sandbox writes it; what it decodes to must be what encoding/json
// makes of the same line, and any line it cannot be sure of is left to
// encoding/json. The lines here are records as written, and each of them
// with every byte cut out, and with a byte of JSON's syntax, a space, an
// escape or a carriage return in place of every byte or before it.
func TestJournalRecordReadAsEncodingJSONReadsIt(t *testing.T) {
	lines := journalLines(t)
	marks := []byte("\"\\,:{}[] \r\t0-1.eE+=A/nul")
	n, plain := 0, 0
	check := func(line []byte) {
		t.Helper()
		n++
		var got, want journalRecord
		if !plainRecord(line, &got) {
			return
		}
		plain++
		if err := json.Unmarshal(line, &want); err != nil {
			t.Fatalf("%q: read as a record, which encoding/json refuses: %v", line, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read as %+v, encoding/json reads %+v", line, got, want)
		}
	}
	for _, line := range lines {
		check(line)
		for i := range line {
			check(slices.Delete(slices.Clone(line), i, i+1))
			for _, m := range marks {
				changed := slices.Clone(line)
				changed[i] = m
				check(changed)
				check(slices.Insert(slices.Clone(line), i, m))
			}
		}
	}
	if plain < len(lines) {
		t.Fatalf("%d of the %d lines as written read without encoding/json", plain, len(lines))
	}
	t.Logf("%d lines, %d read without encoding/json", n, plain)
}

// journalLines are records as the journal writes them, one a line.
func journalLines(t testing.TB) [][]byte {
	records := []journalRecord{
		storeRecord(wasmhost.MemoryEntry{Key: "k", Content: "a note"}),
		storeRecord(wasmhost.MemoryEntry{Key: "ключ", Content: "\x00\x01\"\\\u2028 ünïcode", Category: "c", SessionID: "s-1", Timestamp: -1700000000123}),
		storeRecord(wasmhost.MemoryEntry{Key: "ab", Content: "abcd", Category: "abcde", SessionID: "x", Timestamp: 9223372036854775807}),
		{Op: opForget, Key: []byte("gone")},
		{Op: opStore, Key: []byte{}, Content: []byte{0xff, 0xfe}},
	}
	var lines [][]byte
	for _, r := range records {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, line)
	}
	return lines
}

func FuzzJournalRecord(f *testing.F) {
	for _, line := range journalLines(f) {
		f.Add(line)
	}
	f.Add([]byte(`{"op":"store","key":"a2V5",}`))
	f.Add([]byte(`{"op":"store","KEY":"a2V5"}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		var got, want journalRecord
		if !plainRecord(line, &got) {
			return
		}
		if err := json.Unmarshal(line, &want); err != nil {
			t.Fatalf("%q: read as a record, which encoding/json refuses: %v", line, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read as %+v, encoding/json reads %+v", line, got, want)
		}
	})
}

// The memory folder removed under a running sandbox: every store and
// forget failed as "not written to disk; retry", and retrying never
// helped until the sandbox restarted, with every memory gone. The folder
// is made again and the journal given what the ledger holds, so a load
// finds every entry, in order.
func TestJournalFolderRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "memories")
	j, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(j)
	if _, err := j.load(l); err != nil {
		t.Fatal(err)
	}
	store := func(key string) error {
		e := wasmhost.MemoryEntry{Key: key, Content: "content of " + key, Timestamp: 7}
		l.stored(e)
		return l.record(storeRecord(e))
	}
	for _, k := range []string{"a", "b", "c"} {
		if err := store(k); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := store("d"); err != nil {
		t.Fatalf("a store after the folder was removed: %v", err)
	}
	l.forgot("b")
	if err := l.record(journalRecord{Op: opForget, Key: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the folder made again: %v %v", fi, err)
	}
	loaded := newLedger(nil)
	again, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.load(loaded); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, le := range loaded.inOrder() {
		keys = append(keys, le.e.Key)
	}
	if !slices.Equal(keys, []string{"a", "c", "d"}) {
		t.Fatalf("loaded %v, want [a c d]", keys)
	}
}

// A replica tells the journal it last read from the one at the path by
// its inode and size, but a file's inode number is given to a new file
// once the old one is closed and removed: a rewrite's new file took the
// number of the one before the last rewrite (ext4 gives it back at
// once). Another replica's two rewrites of a same-sized file went
// unseen, the replica answering from the entry as it was (on the code
// before: after the second rewrite it held "v0" where the journal held
// "v2"); of a larger file, it read the new file from where the old one
// ended as if the rest were appended, and failed on a record cut in
// two. Now a replica keeps open the file it last read, so that its
// number names no other while it does.
func TestJournalInodeReusedByARewrite(t *testing.T) {
	dir := t.TempDir()
	a, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	b, err := openJournal(dir, "kv", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.close(); b.close() })
	// b stores "a" again and rewrites the journal, as a store past twice
	// the journal's base does.
	rewritten := func(content string) {
		t.Helper()
		if err := b.append(journalRecord{Op: opStore, Key: []byte("a"), Content: []byte(content)}); err != nil {
			t.Fatal(err)
		}
		f, err := b.lockedFile(os.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := b.rewrite(f); err != nil {
			t.Fatal(err)
		}
	}
	rewritten("v0")
	l := newLedger(a)
	if _, err := a.load(l); err != nil {
		t.Fatal(err)
	}
	// Two rewrites between the replica's reads: the second's new file
	// may take the number of the file the replica read.
	for i, content := range []string{"v2", "v4", "v666", "v88888"} {
		rewritten(content[:len(content)-1] + "x")
		rewritten(content)
		if a.changed() {
			if _, _, err := a.update(l); err != nil {
				t.Fatalf("rewrites to %s: catching up: %v", content, err)
			}
		}
		if got := l.entries["a"].e.Content; got != content {
			t.Fatalf("step %d: the replica holds %q, the journal %q", i+1, got, content)
		}
	}
}
