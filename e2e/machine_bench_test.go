package e2e_test

import (
	"bufio"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// BenchmarkMachine measures, for scale, two prices of the machine every
// other benchmark runs on, so that a run's table can be read against the
// machine it ran on (docs/performance.md, "Twenty-sixth round"). On the
// virtual machine the targets were set on, a page costs about as much
// CPU as two whole requests to the echo server, an idle Go process
// answers ten times later than an idle C one, and the upload, the start
// and the one-session turn stream pay both many times over:
//
//   - page_fault: a page of anonymous memory touched the first time
//     (us/page; faults/page says how many faults that took, under 1 where
//     the kernel hands out huge pages). A process pays it for every page
//     its heap grows into and every page it touches at start.
//   - round_trip/idle: one line to the echo server (another Go process,
//     as the baselines use) and back, 2 ms after the last, so that both
//     processes were idle (p50_us, p99_us): what each process-to-process
//     hop of a turn's chunk costs at one session. round_trip/back_to_back:
//     the same without the pause.
func BenchmarkMachine(b *testing.B) {
	b.Run("page_fault", benchPageFault)
	sock := startEcho(b)
	b.Run("round_trip/idle", func(b *testing.B) { benchRoundTrip(b, sock, 2*time.Millisecond) })
	b.Run("round_trip/back_to_back", func(b *testing.B) { benchRoundTrip(b, sock, 0) })
}

// benchPageFault touches b.N pages of new anonymous mappings, 64 MiB at a
// time; the mappings are made and removed with the timer stopped.
func benchPageFault(b *testing.B) {
	const window = 64 << 20
	page := os.Getpagesize()
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	for done := 0; done < b.N; {
		n := min(window/page, b.N-done)
		b.StopTimer()
		mem, err := syscall.Mmap(-1, 0, n*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for i := 0; i < len(mem); i += page {
			mem[i] = 1
		}
		b.StopTimer()
		if err := syscall.Munmap(mem); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		done += n
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "us/page")
	b.ReportMetric(float64(after.Minflt-before.Minflt)/float64(b.N), "faults/page")
}

// benchRoundTrip sends b.N lines to the echo server at sock, each pause
// after the last reply, and reports the round trips' p50 and p99.
func benchRoundTrip(b *testing.B, sock string, pause time.Duration) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
	line := []byte(`{"jsonrpc":"2.0","method":"ping","id":1}` + "\n")
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		if pause > 0 {
			time.Sleep(pause)
		}
		start := time.Now()
		if _, err := roundTrip(rw, line); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, [][]time.Duration{lat})
}
