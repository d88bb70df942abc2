package launcher

import (
	"bytes"
	"strings"
	"testing"
)

// The upgrade lines a service writes are picked out of its output read
// in chunks that end anywhere, told once each, and only after the "is
// up" line: those seen before it then, a later one when it comes.
func TestUpgradeLinesToldAfterUp(t *testing.T) {
	var out bytes.Buffer
	u := newUpgradeNotices(&out)
	w := &upgradeWatch{seen: u.seen}
	session := `{"level":"info","msg":"schema upgraded","schema":"session","from":"0007_stored_bytes.sql","to":"0008_turn_shown_steps.sql"}` + "\n"
	output := `{"level":"info","msg":"migration applied","schema":"session","migration":"0008_turn_shown_steps.sql"}` + "\n" +
		session +
		`{"level":"info","msg":"serving","note":"not \"schema upgraded\" itself"}` + "\n"
	// Every cut of the output into two chunks, then the repeat of a
	// replica: one line.
	for cut := 0; cut <= len(output); cut++ {
		w.write([]byte(output[:cut]))
		w.write([]byte(output[cut:]))
	}
	if out.Len() != 0 {
		t.Fatalf("told before the stack is up: %q", out.String())
	}
	u.stackUp()
	want := "database upgraded: session 0007_stored_bytes → 0008_turn_shown_steps (a clawmesh older than this one can no longer open it)\n"
	if out.String() != want {
		t.Fatalf("told %q, want %q", out.String(), want)
	}
	out.Reset()
	w.write([]byte(strings.Replace(session, `"session"`, `"config"`, 1)))
	if !strings.HasPrefix(out.String(), "database upgraded: config 0007_stored_bytes → ") {
		t.Fatalf("a line seen after up told %q", out.String())
	}
	out.Reset()
	w.write([]byte(session))
	if out.Len() != 0 {
		t.Fatalf("a line told twice: %q", out.String())
	}
	// The end of a line too long to keep is no line of its own.
	w.write([]byte(`{"level":"info","msg":"migration applied"}` + "\n" + strings.Repeat("x", 2*maxWatchedLine)))
	w.write([]byte(strings.Replace(session, `"session"`, `"upload"`, 1)))
	if out.Len() != 0 {
		t.Fatalf("a long line's end taken for a line: %q", out.String())
	}
	w.write([]byte(strings.Replace(session, `"session"`, `"durable"`, 1)))
	if !strings.HasPrefix(out.String(), "database upgraded: durable ") {
		t.Fatalf("the line after a long one told %q", out.String())
	}
}
