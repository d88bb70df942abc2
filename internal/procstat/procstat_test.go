package procstat

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	// A command name with a space and a parenthesis, state S, parent 1,
	// utime 250 and stime 75 ticks, started 1234 ticks after boot.
	line := []byte("4242 (gate way)) S 1 4242 4242 0 -1 4194560 1185 0 0 0 250 75 0 0 20 0 9 0 1234 1000 200\n")
	st, err := Parse(line)
	if err != nil || st != (Stat{State: 'S', PPID: 1, CPU: 3250 * time.Millisecond, Start: 1234}) {
		t.Fatalf("Parse = %+v, %v; want S, 1, 3.25s, 1234", st, err)
	}
	for _, bad := range []string{
		"",
		"4242 gateway S 1",
		"4242 (x) S 1 2",
		"4242 (x) S 1 4242 4242 0 -1 4194560 1185 0 0 0 2x0 75 0",
		"4242 (x) S x 4242 4242 0 -1 4194560 1185 0 0 0 250 75 0",
		"4242 (x) SS 1 4242 4242 0 -1 4194560 1185 0 0 0 250 75 0",
	} {
		if st, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) = %+v, accepted", bad, st)
		}
	}
}

// This process's own line: its parent is the one the os package names,
// and its CPU time grows while it spins.
func TestSelfAndRead(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	// The state is the main thread's, which may be asleep while this
	// goroutine runs on another: any state a live process can be in.
	if self.PPID != os.Getppid() || !strings.ContainsRune("RSDI", rune(self.State)) {
		t.Fatalf("Self() = %+v; want parent %d, a live state", self, os.Getppid())
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		now, err := Read(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now.CPU > self.CPU {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %v while spinning for 5 s", now.CPU)
		}
	}
	if _, err := Read(-1); err == nil {
		t.Fatal("Read(-1) succeeded")
	}
}
