package pluginsandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testenv"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// bigResult is the misbehave tool's call whose result is just under the
// host's 16 MiB: a 15-byte line 1,048,560 times, each line's newline
// escaped, so the output decodes to 15 MiB.
const (
	bigPeriod  = "0123456789abcd\n"
	bigRepeats = 1<<20 - 16
	bigArgs    = `{"mode":"repeat","text":"0123456789abcd\n","n":1048560}`
	keptBytes  = 1 << 20 // what the session service keeps (MaxLiveToolOutputBytes)
)

// newBigResultServer serves the misbehave tool with fuel for writing a 16
// MiB result.
func newBigResultServer(tb testing.TB) *testServer {
	tb.Helper()
	dir := tb.TempDir()
	installExample(tb, dir, "misbehave")
	lim := wasmhost.DefaultLimits()
	lim.CallFuel = 1 << 40
	return newTestServerLimits(tb, dir, lim)
}

func callBig(ctx context.Context, ts *testServer) (*pluginv1.ExecuteToolResponse, error) {
	return ts.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "misbehave", ArgumentsJson: bigArgs, OutputLimit: keptBytes})
}

// A tool's result of 16 MiB, for a caller that keeps 1 MiB of its output,
// was held whole by the sandbox before the cut: copied out of the guest's
// memory (16 MiB), then unquoted into a second string (15 MiB). The
// output is now kept only as far as the cut while it is read from the
// guest's memory, so the call allocates about what is kept.
func TestToolOutputCutAsItIsRead(t *testing.T) {
	ts := newBigResultServer(t)
	ctx := context.Background()
	var got *pluginv1.ExecuteToolResponse
	var err error
	perCall := testenv.AllocatedBytes(func() { got, err = callBig(ctx, ts) })
	want := strings.Repeat(bigPeriod, bigRepeats)
	if err != nil || !got.GetSuccess() || got.GetOutput() != want[:keptBytes] || got.GetOutputBytes() != int64(len(want)) {
		t.Fatalf("%d bytes of output, output_bytes %d, %q, %v; want the first %d of %d", len(got.GetOutput()), got.GetOutputBytes(), got.GetError(), err, keptBytes, len(want))
	}
	t.Logf("a %d-byte output, %d kept: %d bytes allocated by the call", len(want), keptBytes, perCall)
	if perCall > 4*keptBytes {
		t.Fatalf("a call keeping %d bytes of a %d-byte output allocated %d bytes", keptBytes, len(want), perCall)
	}
}

// BenchmarkConcurrentBigResults runs 8 calls at once, each returning a
// 16 MiB result of which 1 MiB is kept: B/op is what the 8 allocate,
// peak-RSS-MiB the process's peak resident set over the timed part
// (VmHWM, reset once the server is up), which holds the guests' memory
// too.
func BenchmarkConcurrentBigResults(b *testing.B) {
	const calls = 8
	ts := newBigResultServer(b)
	ctx := context.Background()
	if _, err := callBig(ctx, ts); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	resetPeakRSS(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for range calls {
			wg.Go(func() {
				res, err := callBig(ctx, ts)
				if err == nil && res.GetOutputBytes() == 0 {
					err = context.Canceled
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-RSS-MiB")
}

// resetPeakRSS sets the process's VmHWM back to its current resident set
// (proc(5), clear_refs "5").
func resetPeakRSS(tb testing.TB) {
	tb.Helper()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		tb.Skipf("cannot reset the peak resident set: %v", err)
	}
}

// peakRSS is VmHWM in bytes.
func peakRSS(tb testing.TB) int64 {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmHWM in /proc/self/status")
	return 0
}
