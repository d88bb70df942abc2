// Package procstat reads a process's line of /proc/<pid>/stat (Linux):
// its state, its parent and the CPU time it has spent. The gateway's
// health record, the durable bridge's peer check and the benchmarks read
// it; the line's command name, which may hold spaces and parentheses, is
// stepped over here once.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// ClockTick is the unit of utime and stime: USER_HZ, which the kernel's
// ABI fixes at 100 on every Linux the stack runs on.
const ClockTick = 10 * time.Millisecond

// Stat is what the stack reads of a process's stat line.
type Stat struct {
	State byte          // field 3: R, S, D, T, Z, ...
	PPID  int           // field 4
	CPU   time.Duration // fields 14 and 15, utime plus stime
	// Start is field 22, when the process started in clock ticks since
	// boot (0 when the line stops short of it): with the pid, a process
	// and not a later one given the same pid.
	Start uint64
}

// Read reads the stat line of process pid.
func Read(pid int) (Stat, error) {
	return readFile("/proc/" + strconv.Itoa(pid) + "/stat")
}

// Self reads this process's stat line.
func Self() (Stat, error) { return readFile("/proc/self/stat") }

// Children lists the processes whose parent is pid, from /proc.
func Children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := Read(child); err == nil && st.PPID == pid {
			out = append(out, child)
		}
	}
	return out
}

func readFile(path string) (Stat, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Stat{}, err
	}
	st, err := Parse(raw)
	if err != nil {
		return Stat{}, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// Parse parses a stat line.
func Parse(raw []byte) (Stat, error) {
	// The command name (field 2) is in parentheses and may hold anything:
	// the fields after it start past the last ')'.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return Stat{}, errors.New("no command name")
	}
	f := bytes.Fields(raw[i+1:])
	// f[0] is field 3.
	if len(f) < 13 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("%d fields after the command name", len(f))
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	utime, err2 := strconv.ParseInt(string(f[11]), 10, 64)
	stime, err3 := strconv.ParseInt(string(f[12]), 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return Stat{}, fmt.Errorf("ppid %q, utime %q, stime %q: %w", f[1], f[11], f[12], err)
	}
	st := Stat{State: f[0][0], PPID: ppid, CPU: time.Duration(utime+stime) * ClockTick}
	if len(f) > 19 {
		st.Start, _ = strconv.ParseUint(string(f[19]), 10, 64)
	}
	return st, nil
}
