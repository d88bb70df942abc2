// Package steptrace times the steps of a request in each process of the
// stack, for measurement only. With CLAWMESH_STEP_TRACE naming a folder,
// every process appends one line per step to <folder>/<pid>.trace:
// "<process> <step> <milliseconds>"; without it, a step costs a clock
// read and a test of one string.
//
// A benchmark's figure says how long the client waited, and a CPU profile
// what each process computed; neither says which step of which process
// the client waited on. The rounds before this package answered that with
// a throwaway build each time (docs/performance.md, "Fifty-ninth round:
// upload", "Sixtieth round: upload"). `go run ./internal/steptrace/summary
// <folder>` prints each step's count, median and mean.
package steptrace

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Env names the folder the traces are written to; unset, nothing is.
const Env = "CLAWMESH_STEP_TRACE"

// maxLines bounds one process's trace (about 40 bytes a line): a stack
// left running with the variable set does not fill the disk.
const maxLines = 1 << 20

var dir = os.Getenv(Env)

var out struct {
	mu     sync.Mutex
	f      *os.File
	lines  int
	failed bool
}

// Since records that step of process proc took from start until now.
func Since(proc, step string, start time.Time) {
	if dir == "" {
		return
	}
	d := time.Since(start)
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.failed || out.lines >= maxLines {
		return
	}
	if out.f == nil {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%d.trace", os.Getpid())), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			// A measurement aid: the process goes on untraced.
			out.failed = true
			return
		}
		out.f = f
	}
	out.lines++
	if _, err := fmt.Fprintf(out.f, "%s %s %.3f\n", proc, step, float64(d.Nanoseconds())/1e6); err != nil {
		out.failed = true
	}
}
