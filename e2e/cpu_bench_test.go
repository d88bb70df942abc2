package e2e_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// 100 on every Linux the stack runs on (the kernel's ABI fixes it there).
const clockTick = 10 * time.Millisecond

// cpuMeter sums the CPU time (user and system) spent by this process and
// by the processes pids names, between two readings. At 100 sessions the
// turn stream's chunks come in clusters (timers that come due while a
// process is busy fire together) and wait on one another in every
// process they cross, which are busy much of the time: the p50 follows
// the CPU those processes spend per chunk (docs/performance.md,
// "Fifteenth round").
type cpuMeter struct {
	self  string                // this process's part in the figure
	pids  func() map[int]string // the other processes, by pid, and their names
	start cpuSample
}

// cpuSample is the CPU time each process has spent so far, by name
// (processes of one name summed).
type cpuSample map[string]time.Duration

func (c cpuSample) sum() (d time.Duration) {
	for _, v := range c {
		d += v
	}
	return d
}

// sample reads this process's CPU time and that of pids.
func (m *cpuMeter) sample(pids map[int]string) (cpuSample, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return nil, fmt.Errorf("getrusage: %w", err)
	}
	c := cpuSample{m.self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	for pid, name := range pids {
		d, err := processCPU(pid)
		if err != nil {
			// A process gone between the listing and the read: the stack
			// keeps its processes for the whole benchmark, so this is one
			// that was ending anyway (a zombie's reaping, say).
			continue
		}
		c[name] += d
	}
	return c, nil
}

// begin records the CPU spent so far; a nil meter measures nothing.
func (m *cpuMeter) begin(b *testing.B) {
	if m == nil {
		return
	}
	var err error
	if m.start, err = m.sample(m.pids()); err != nil {
		b.Fatal(err)
	}
}

// report records the CPU spent since begin, per unit of work done.
func (m *cpuMeter) report(b *testing.B, units int, unit string) {
	if m == nil || units == 0 {
		return
	}
	now, err := m.sample(m.pids())
	if err != nil {
		b.Fatal(err)
	}
	reportCPU(b, m.start, now, units, unit)
}

// shownApart are the processes whose part of cpu_us is reported on its
// own (<name>_cpu_us); the others' (the launcher, PostgreSQL, services a
// chunk does not cross) are summed as rest_cpu_us.
var shownApart = map[string]bool{"client": true, "pubsub": true, "gateway": true, "session": true, "nats-server": true, "durable-bridge": true}

// reportCPU reports the CPU spent between two samples per unit of work,
// and each process's part of it.
func reportCPU(b *testing.B, from, to cpuSample, units int, unit string) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(units) }
	b.ReportMetric(per(to.sum()-from.sum()), "cpu_us/"+unit)
	var rest time.Duration
	for name, d := range to {
		if shownApart[name] {
			b.ReportMetric(per(d-from[name]), name+"_cpu_us/"+unit)
		} else {
			rest += d - from[name]
		}
	}
	if len(to) > 2 { // the baseline's two processes are both shown apart
		b.ReportMetric(per(rest), "rest_cpu_us/"+unit)
	}
}

// streamWindow measures a meter over the part of a stack's turn stream
// where every session streams: from the moment each session has delivered
// its first chunk to the moment each has delivered its last. The turns'
// starts and ends (a prompt's and a completion's transactions, a hundred
// of each) are work the bare NATS baseline has no counterpart for, and
// would otherwise be spread over the chunks. Each session's reader calls
// chunk for every chunk and abandon when it stops, whatever the reason,
// so the window always closes.
type streamWindow struct {
	first, last sync.WaitGroup
	chunks      atomic.Int64
	done        chan struct{}
	from, to    cpuSample
	units       int64
	err         error
}

// openWindow starts measuring for sessions sessions; nil when m is.
func openWindow(m *cpuMeter, sessions int) *streamWindow {
	if m == nil {
		return nil
	}
	w := &streamWindow{done: make(chan struct{})}
	w.first.Add(sessions)
	w.last.Add(sessions)
	// Listed now: the readings in the stream's midst are of a few files
	// in /proc, not a scan of every process's command line beside the
	// client's readers. The stack's processes stay the same
	// throughout; a PostgreSQL backend started meanwhile is missed, and
	// PostgreSQL is nearly idle while the turns stream.
	pids := m.pids()
	go func() {
		defer close(w.done)
		w.first.Wait()
		from, err := m.sample(pids)
		n0 := w.chunks.Load()
		w.last.Wait()
		to, err1 := m.sample(pids)
		w.from, w.to, w.units, w.err = from, to, w.chunks.Load()-n0, errors.Join(err, err1)
	}()
	return w
}

// chunk records a session's n-th chunk of per.
func (w *streamWindow) chunk(n, per int) {
	if w == nil {
		return
	}
	w.chunks.Add(1)
	if n == 1 {
		w.first.Done()
	}
	if n == per {
		w.last.Done()
	}
}

// abandon records that a session's reader stopped after n chunks of per.
func (w *streamWindow) abandon(n, per int) {
	if w == nil {
		return
	}
	if n < 1 {
		w.first.Done()
	}
	if n < per {
		w.last.Done()
	}
}

// report waits for the window to close and reports the CPU per chunk in it.
func (w *streamWindow) report(b *testing.B) {
	if w == nil {
		return
	}
	<-w.done
	if w.err != nil {
		b.Fatal(w.err)
	}
	if w.units > 0 {
		reportCPU(b, w.from, w.to, int(w.units), "chunk")
	}
}

// processCPU reads a process's user and system time from /proc.
func processCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	d, err := statCPU(raw)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return d, nil
}

// statCPU is utime plus stime of a /proc/<pid>/stat line.
func statCPU(raw []byte) (time.Duration, error) {
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start past the last ')'.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, errors.New("no command name")
	}
	f := bytes.Fields(raw[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name", len(f))
	}
	utime, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("utime %q, stime %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}

func TestStatCPU(t *testing.T) {
	// A command name with a space and a parenthesis, utime 250 and stime
	// 75 ticks.
	line := []byte("4242 (gate way)) S 1 4242 4242 0 -1 4194560 1185 0 0 0 250 75 0 0 20 0 9 0 1234 1000 200\n")
	d, err := statCPU(line)
	if err != nil || d != 3250*time.Millisecond {
		t.Fatalf("statCPU = %v, %v; want 3.25s", d, err)
	}
	for _, bad := range []string{"", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 1185 0 0 0 2x0 75 0"} {
		if _, err := statCPU([]byte(bad)); err == nil {
			t.Errorf("statCPU(%q) accepted", bad)
		}
	}
	// This process's own line reads, and spins up by a tick or more.
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		now, err := processCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %v while spinning for 5 s", now)
		}
	}
}

// A stream window closes once every session's reader has seen its last
// chunk or stopped, so a failing stream cannot hang the benchmark, and
// counts no more chunks than were read.
func TestStreamWindowCloses(t *testing.T) {
	meter := &cpuMeter{self: "test", pids: func() map[int]string { return map[int]string{os.Getpid(): "again"} }}
	closed := func(w *streamWindow) bool {
		select {
		case <-w.done:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}

	// Every session reads its five chunks.
	w := openWindow(meter, 3)
	for n := 1; n <= 5; n++ {
		for range 3 {
			w.chunk(n, 5)
		}
	}
	for range 3 {
		w.abandon(5, 5) // a reader's deferred call after a full stream: nothing
	}
	if !closed(w) {
		t.Fatal("window still open after every session's last chunk")
	}
	if w.err != nil || w.units < 0 || w.units > 15 {
		t.Fatalf("units %d, err %v", w.units, w.err)
	}
	if w.to["test"] < w.from["test"] || w.to["again"] < w.from["again"] {
		t.Fatalf("CPU went back: from %v to %v", w.from, w.to)
	}

	// One session reads two chunks and fails, one fails before any.
	w = openWindow(meter, 3)
	for n := 1; n <= 5; n++ {
		w.chunk(n, 5)
	}
	w.chunk(1, 5)
	w.chunk(2, 5)
	w.abandon(2, 5)
	w.abandon(0, 5)
	if !closed(w) {
		t.Fatal("window still open after the other sessions stopped")
	}

	// No meter, no window: every call is a no-op.
	var none *streamWindow = openWindow(nil, 3)
	none.chunk(1, 1)
	none.abandon(0, 1)
	if none != nil {
		t.Fatal("a window without a meter")
	}
}
