package pluginsandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
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
	benchAtOnce(b, calls, func() error {
		res, err := callBig(ctx, ts)
		if err == nil && res.GetOutputBytes() == 0 {
			err = context.Canceled
		}
		return err
	})
}

// benchAtOnce times calls runs of call at once an iteration, failing on
// the first error; B/op is what they allocate together, peak-RSS-MiB the
// process's peak resident set over the timed part (VmHWM, reset here).
func benchAtOnce(b *testing.B, calls int, call func() error) {
	runtime.GC()
	resetPeakRSS(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for range calls {
			wg.Go(func() { errs <- call() })
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

// bigFailMisbehave is misbehave whose modes "bigfail" and "bigrefuse"
// fail with an error of bigPeriod repeated bigRepeats times, 15 MiB: the
// Go error (the envelope's err) and a failed result's error.
const bigFailMisbehave = `//go:build wasip1

package main

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk/tool"
)

type bigFail struct{ misbehave }

var bigText string

func (b bigFail) Execute(args json.RawMessage) (tool.Result, error) {
	var in struct {
		Mode string ` + "`json:\"mode\"`" + `
	}
	_ = json.Unmarshal(args, &in)
	if bigText == "" {
		bigText = strings.Repeat("0123456789abcd\n", 1<<20-16)
	}
	switch in.Mode {
	case "bigfail":
		return tool.Result{}, errors.New(bigText)
	case "bigrefuse":
		return tool.Failure(bigText), nil
	}
	return b.misbehave.Execute(args)
}

func init() { tool.Register(bigFail{}) } // after main.go's init
`

// A tool's error of 15 MiB, for a caller that keeps 1 MiB, was decoded
// whole (encoding/json for the err side, the short reading for a failed
// result's error) and sent whole, to be cut by the session. It is now
// cut as it is read, and sent as the failed call's output with its whole
// size, which the session shows as it shows an error, cut with its mark.
func TestToolErrorCutAsItIsRead(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "misbehave")
	wasm, err := guestbuild.WasmWith("misbehave", "testhooks.go", bigFailMisbehave)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(wasm)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "misbehave", "plugin.wasm"), data, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	lim := wasmhost.DefaultLimits()
	lim.CallFuel = 1 << 40
	ts := newTestServerLimits(t, dir, lim)
	ctx := context.Background()
	want := strings.Repeat(bigPeriod, bigRepeats)
	for _, mode := range []string{"bigfail", "bigrefuse"} {
		var got *pluginv1.ExecuteToolResponse
		perCall := testenv.AllocatedBytes(func() {
			got, err = ts.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{ToolName: "misbehave", ArgumentsJson: `{"mode":"` + mode + `"}`, OutputLimit: keptBytes})
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: a %d-byte error, %d kept: %d bytes allocated by the call", mode, len(want), keptBytes, perCall)
		if got.GetSuccess() || got.GetError() != "" || got.GetOutput() != want[:keptBytes] || got.GetOutputBytes() != int64(len(want)) {
			t.Fatalf("%s: success %v, %d bytes of error, %d of output, output_bytes %d; want a failure whose output is the first %d bytes of the %d-byte error",
				mode, got.GetSuccess(), len(got.GetError()), len(got.GetOutput()), got.GetOutputBytes(), keptBytes, len(want))
		}
		if perCall > 4*keptBytes {
			t.Errorf("%s: a call keeping %d bytes of a %d-byte error allocated %d bytes", mode, keptBytes, len(want), perCall)
		}
	}
}
