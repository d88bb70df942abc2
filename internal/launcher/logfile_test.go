package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testdisk"
)

// A log past its bound is rotated where a line starts: every line is
// whole in one file, the two files hold the newest lines in order, and
// neither passes the bound by more than a write. A write with no line end
// waits for its line unless the file holds twice the bound.
func TestLogFileRotatesAtALineStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.log")
	l, err := openLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var lines []string
	for i := range 40 {
		line := fmt.Sprintf("line %02d %s\n", i, strings.Repeat("x", 20))
		lines = append(lines, line)
		// Half the lines come in two writes.
		if i%2 == 1 {
			if _, err := l.Write([]byte(line[:5])); err != nil {
				t.Fatal(err)
			}
			line = line[5:]
		}
		if _, err := l.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	older, _ := os.ReadFile(path + ".old")
	newer, _ := os.ReadFile(path)
	if len(older) > 100+30 || len(newer) > 100+30 || len(newer) == 0 || len(older) == 0 {
		t.Fatalf("%d and %d bytes, bound 100", len(older), len(newer))
	}
	kept := string(older) + string(newer)
	if !strings.HasSuffix(strings.Join(lines, ""), kept) || !strings.HasPrefix(kept, "line ") {
		t.Fatalf("kept %q: not the newest whole lines in order", kept)
	}

	// No line end: the file goes on to twice the bound, no further.
	for range 10 {
		if _, err := l.Write([]byte(strings.Repeat("y", 30))); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() > 2*100+30 {
		t.Fatalf("an endless line: %v %v", fi.Size(), err)
	}

	// Reopened, it counts what the file holds.
	l.Close()
	if l, err = openLog(path, 100); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	if _, err := l.Write([]byte("\nnext\n")); err != nil {
		t.Fatal(err)
	}
	if l.size != before.Size()+6 {
		t.Fatalf("size %d after reopening a file of %d", l.size, before.Size())
	}
}

// A log that cannot be written drops the run's lines without blocking
// it, and says so once.
func TestCopyLogSaysOnceWhenItCannotWrite(t *testing.T) {
	l, err := openLog(filepath.Join(t.TempDir(), "p.log"), 100)
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // every write fails from here
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var told []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyLog(r, l, func(err error) { told = append(told, err) }, nil)
	}()
	for i := range 50 {
		if _, err := fmt.Fprintf(w, "line %d\n", i); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	<-done
	r.Close()
	if len(told) != 1 {
		t.Fatalf("told %d times: %v", len(told), told)
	}
}

// On a full disk a write of a log line stopped partway: the head of the
// line stayed in the file and the next line went on from it, two JSON
// records run together into one no reader could parse (seen in
// session.log after a commit on a full disk). The cut line is taken out
// again and the rest of it dropped: the log holds whole lines only, and
// goes on once there is room.
func TestLogFileKeepsWholeLinesOnAFullDisk(t *testing.T) {
	disk := testdisk.New(t, 1<<20)
	path := filepath.Join(disk.Dir, "p.log")
	l, err := openLog(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Write([]byte("first\n")); err != nil {
		t.Fatal(err)
	}
	disk.Fill()
	// Longer than the room left in the file's last page, in two reads of
	// the pipe; the next line comes in the second.
	long := `{"msg":"` + strings.Repeat("x", 6000) + `"}` + "\n"
	if _, err := l.Write([]byte(long[:5000])); err == nil {
		t.Fatal("a line past the room left was written")
	}
	if _, err := l.Write([]byte(long[5000:] + "third\n")); err != nil {
		t.Fatalf("a short line with the room given back: %v", err)
	}
	disk.Free()
	if _, err := l.Write([]byte("fourth\n")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "first\nthird\nfourth\n" {
		t.Fatalf("the log holds %d bytes, not whole lines: %.80q...", len(got), got)
	}
	if fi, _ := os.Stat(path); l.size != fi.Size() {
		t.Fatalf("size %d for a file of %d", l.size, fi.Size())
	}
}

// A log removed under the launcher (by hand, to free space on a full
// disk, or with the logs folder) was written on into the removed file:
// its space was not freed until the next rotation, and the process's
// lines were nowhere to read until the launcher restarted. The file is
// made again at the next line.
func TestLogFileRemovedIsMadeAgain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "p.log")
	l, err := openLog(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.reopenEvery = 0 // every write looks
	write := func(s string) {
		t.Helper()
		if _, err := l.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	holds := func(want string) {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Fatalf("the log holds %q (%v), want %q", got, err, want)
		}
	}
	write("one\n")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	write("two\n")
	holds("two\n")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	write("thr")
	write("ee\n")
	holds("three\n")
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the folder made again: %v %v", fi, err)
	}
}
