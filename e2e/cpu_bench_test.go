package e2e_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/procstat"
)

// cpuMeter sums the CPU time (user and system) spent by this process and
// by the processes pids names. At 100 sessions the turn stream's chunks
// come in clusters (timers that come due while a process is busy fire
// together) and wait on one another in every process they cross, which
// are busy much of the time: the p50 follows the CPU those processes
// spend per chunk (docs/performance.md, "Fifteenth round").
type cpuMeter struct {
	self string                // this process's part in the figure
	pids func() map[int]string // the other processes, by pid, and their names
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

// switchSample is the context switches (voluntary and not) each
// process's threads have made so far, by name: a thread's switch is one
// sleep and wake-up of it, the system's part of a goroutine hand-off
// across threads (an update read, handed on, written).
type switchSample map[string]int64

// ioSample is the read and write system calls each process has made so
// far, by name, as /proc/<pid>/io counts them (syscr, syscw: read,
// write and their vector and positioned forms, a socket's included;
// epoll_wait, futex and the like are in neither). Per chunk they say
// whether a process reads and writes each update on its own or several
// at once: every socket write of a chunk is one more wake-up downstream.
type ioSample map[string][2]int64

// sample reads this process's CPU time, context switches and read and
// write calls, and those of pids.
func (m *cpuMeter) sample(pids map[int]string) (cpuSample, switchSample, ioSample, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return nil, nil, nil, fmt.Errorf("getrusage: %w", err)
	}
	c := cpuSample{m.self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	cs := switchSample{m.self: ru.Nvcsw + ru.Nivcsw}
	io := ioSample{m.self: ioCalls("self")}
	for pid, name := range pids {
		st, err := procstat.Read(pid)
		if err != nil {
			// A process gone between the listing and the read: the stack
			// keeps its processes for the whole benchmark, so this is one
			// that was ending anyway (a zombie's reaping, say).
			continue
		}
		c[name] += st.CPU
		cs[name] += threadSwitches(pid)
		rw := ioCalls(strconv.Itoa(pid))
		io[name] = [2]int64{io[name][0] + rw[0], io[name][1] + rw[1]}
	}
	return c, cs, io, nil
}

var (
	readCalls  = []byte("\nsyscr:")
	writeCalls = []byte("\nsyscw:")
)

// ioCalls reads /proc/<pid>/io's read and write calls (pid "self" for
// this process); zeros when the file cannot be read.
func ioCalls(pid string) (rw [2]int64) {
	raw, err := os.ReadFile("/proc/" + pid + "/io")
	if err != nil {
		return rw
	}
	raw = append([]byte("\n"), raw...)
	for k, key := range [][]byte{readCalls, writeCalls} {
		i := bytes.Index(raw, key)
		if i < 0 {
			continue
		}
		v, _, _ := bytes.Cut(raw[i+len(key):], []byte("\n"))
		if n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
			rw[k] = n
		}
	}
	return rw
}

var (
	voluntarySwitches    = []byte("\nvoluntary_ctxt_switches:")
	nonvoluntarySwitches = []byte("\nnonvoluntary_ctxt_switches:")
)

// threadSwitches sums the context switches of process pid's threads, as
// their /proc status files count them (a process's own status file counts
// its first thread's only). A thread that ended meanwhile takes its count
// with it: the stack's Go processes keep theirs.
func threadSwitches(pid int) (n int64) {
	status, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/status")
	for _, path := range status {
		raw, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, key := range [][]byte{voluntarySwitches, nonvoluntarySwitches} {
			i := bytes.Index(raw, key)
			if i < 0 {
				continue
			}
			v, _, _ := bytes.Cut(raw[i+len(key):], []byte("\n"))
			if k, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
				n += k
			}
		}
	}
	return n
}

// shownApart are the processes whose part of cpu_us is reported on its
// own (<name>_cpu_us); the others' (the launcher, PostgreSQL, services a
// chunk does not cross) are summed as rest_cpu_us.
var shownApart = map[string]bool{"client": true, "pubsub": true, "gateway": true, "session": true, "nats-server": true, "durable-bridge": true, "publisher": true, "forwarder": true}

// reportSwitches reports the context switches made between two samples
// per unit of work, in all and by process (<name>_cs/<unit>, for the
// processes shownApart).
func reportSwitches(b *testing.B, from, to switchSample, units int, unit string) {
	per := func(n int64) float64 { return float64(n) / float64(units) }
	var all int64
	for name, n := range to {
		all += n - from[name]
		if shownApart[name] {
			b.ReportMetric(per(n-from[name]), name+"_cs/"+unit)
		}
	}
	b.ReportMetric(per(all), "cs/"+unit)
}

// reportIO reports the read and write calls made between two samples per
// unit of work, by process (<name>_rd/<unit>, <name>_wr/<unit>, for the
// processes shownApart).
func reportIO(b *testing.B, from, to ioSample, units int, unit string) {
	for name, rw := range to {
		if shownApart[name] {
			b.ReportMetric(float64(rw[0]-from[name][0])/float64(units), name+"_rd/"+unit)
			b.ReportMetric(float64(rw[1]-from[name][1])/float64(units), name+"_wr/"+unit)
		}
	}
}

// reportCPU reports the CPU spent between two samples per unit of work,
// and each process's part of it.
func reportCPU(b *testing.B, from, to cpuSample, units int, unit string) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(units) }
	b.ReportMetric(per(to.sum()-from.sum()), "cpu_us/"+unit)
	var rest time.Duration
	others := false
	for name, d := range to {
		if shownApart[name] {
			b.ReportMetric(per(d-from[name]), name+"_cpu_us/"+unit)
		} else {
			rest, others = rest+d-from[name], true
		}
	}
	if others {
		b.ReportMetric(per(rest), "rest_cpu_us/"+unit)
	}
}

// streamWindow measures a meter over the part of a turn stream where every
// session streams: from the moment each session has delivered its first
// chunk to the moment each has delivered its last, counting the chunks
// delivered in between. The stack's turns' starts and ends (a prompt's
// and a completion's transactions, a hundred of each) are work the bare
// NATS baseline has no counterpart for, and would otherwise be spread
// over the chunks; the baseline is measured the same way. A session's
// reader calls chunk for each of its chunks and abandon when it stops,
// whatever the reason, so the window always closes; a chunk after its
// session was abandoned is ignored.
type streamWindow struct {
	per            int
	mu             sync.Mutex
	got            []int  // chunks delivered, by session
	ended          []bool // by session: its last chunk came, or it was abandoned
	toStart, toEnd int    // sessions without a first chunk, without an end
	units          int    // chunks delivered while the window was open
	opened, closed chan struct{}

	done         chan struct{} // the readings are taken
	from, to     cpuSample
	csFrom, csTo switchSample
	ioFrom, ioTo ioSample
	err          error
}

// openWindow starts measuring sessions streams of per chunks each; nil
// when m is.
func openWindow(m *cpuMeter, sessions, per int) *streamWindow {
	if m == nil {
		return nil
	}
	w := &streamWindow{
		per: per, got: make([]int, sessions), ended: make([]bool, sessions),
		toStart: sessions, toEnd: sessions,
		opened: make(chan struct{}), closed: make(chan struct{}), done: make(chan struct{}),
	}
	// Listed now: the readings in the stream's midst are of a few files
	// in /proc, not a scan of every process's command line beside the
	// readers. The stack's processes stay the same throughout; a
	// PostgreSQL backend started meanwhile is missed, and PostgreSQL is
	// nearly idle while the turns stream.
	pids := m.pids()
	go func() {
		defer close(w.done)
		<-w.opened
		from, csFrom, ioFrom, err := m.sample(pids)
		<-w.closed
		to, csTo, ioTo, err1 := m.sample(pids)
		w.from, w.to, w.csFrom, w.csTo, w.err = from, to, csFrom, csTo, errors.Join(err, err1)
		w.ioFrom, w.ioTo = ioFrom, ioTo
	}()
	return w
}

// chunk records a chunk of session i.
func (w *streamWindow) chunk(i int) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended[i] {
		return
	}
	if w.toStart == 0 {
		w.units++
	}
	w.got[i]++
	w.mark(i, w.got[i] == 1, w.got[i] == w.per)
}

// abandon records that session i's reader stopped; after its last chunk
// that changes nothing.
func (w *streamWindow) abandon(i int) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended[i] {
		w.mark(i, w.got[i] == 0, true)
	}
}

// mark counts session i's first chunk and its end; w.mu is held.
func (w *streamWindow) mark(i int, first, end bool) {
	if first {
		if w.toStart--; w.toStart == 0 {
			close(w.opened)
		}
	}
	if end {
		w.ended[i] = true
		if w.toEnd--; w.toEnd == 0 {
			close(w.closed)
		}
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
	w.mu.Lock()
	units := w.units
	w.mu.Unlock()
	if units > 0 {
		reportCPU(b, w.from, w.to, units, "chunk")
		reportSwitches(b, w.csFrom, w.csTo, units, "chunk")
		reportIO(b, w.ioFrom, w.ioTo, units, "chunk")
	}
}

// A stream window opens at the last session's first chunk and closes at
// the last session's end, counting the chunks in between; it closes when
// sessions stop early too, so a failing stream cannot hang the benchmark.
func TestStreamWindow(t *testing.T) {
	t.Parallel()
	meter := &cpuMeter{self: "test", pids: func() map[int]string { return map[int]string{os.Getpid(): "again"} }}
	closed := func(w *streamWindow) bool {
		select {
		case <-w.done:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}

	// Three sessions read their five chunks in turn: the window opens at
	// the third chunk and holds the twelve after it.
	w := openWindow(meter, 3, 5)
	for range 5 {
		for i := range 3 {
			w.chunk(i)
		}
	}
	for i := range 3 {
		w.abandon(i) // a reader's deferred call after a full stream: nothing
	}
	if !closed(w) {
		t.Fatal("window still open after every session's last chunk")
	}
	if w.err != nil || w.units != 12 {
		t.Fatalf("units %d (want 12), err %v", w.units, w.err)
	}
	if w.to["test"] < w.from["test"] || w.to["again"] < w.from["again"] {
		t.Fatalf("CPU went back: from %v to %v", w.from, w.to)
	}
	// This process's threads have switched before the window closed (a
	// test binary's goroutines block and wake); the count never goes
	// back, read either way.
	if w.csFrom["again"] <= 0 || w.csTo["test"] < w.csFrom["test"] || w.csTo["again"] < w.csFrom["again"] {
		t.Fatalf("context switches: from %v to %v", w.csFrom, w.csTo)
	}
	// Nor do the read and write calls, and this process has made some
	// (its binary's and /proc's files read).
	if w.ioFrom["again"][0] <= 0 || w.ioTo["test"][0] < w.ioFrom["test"][0] || w.ioTo["again"][1] < w.ioFrom["again"][1] {
		t.Fatalf("read and write calls: from %v to %v", w.ioFrom, w.ioTo)
	}

	// One session reads its five; one reads two and fails; one fails
	// before any. The window opens and closes at the last failure, with
	// nothing in it; a chunk arriving after its session was abandoned
	// (a message late on the bus) is ignored.
	w = openWindow(meter, 3, 5)
	for range 5 {
		w.chunk(0)
	}
	w.chunk(1)
	w.chunk(1)
	w.abandon(1)
	w.chunk(1)
	w.abandon(2)
	if !closed(w) {
		t.Fatal("window still open after the other sessions stopped")
	}
	if w.units != 0 || w.got[1] != 2 {
		t.Fatalf("units %d, session 1 got %d", w.units, w.got[1])
	}

	// No meter, no window: every call is a no-op.
	none := openWindow(nil, 3, 5)
	none.chunk(1)
	none.abandon(0)
	if none != nil {
		t.Fatal("a window without a meter")
	}
}
