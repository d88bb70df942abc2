package wasmhost_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// reportLatency adds p50 and p99 of the samples as metrics.
func reportLatency(b *testing.B, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-us")
}

// timeCalls runs b.N calls of tool, each after pause (not timed: the pool
// refills meanwhile), and reports their p50 and p99.
func timeCalls(b *testing.B, tool *wasmhost.Tool, call wasmhost.ToolCall, pause time.Duration) {
	ctx := context.Background()
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if pause > 0 {
			b.StopTimer()
			time.Sleep(pause)
			b.StartTimer()
		}
		start := time.Now()
		if _, err := tool.Execute(ctx, call); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, samples)
}

// BenchmarkEchoCall measures one echo tool call, fresh instance included.
// "paced" leaves the pool time to refill between calls, as a tool call in a
// turn does (the latency a caller sees); "back-to-back" drains the pool and
// so measures instantiation throughput on two cores.
func BenchmarkEchoCall(b *testing.B) {
	for _, mode := range []string{"paced", "back-to-back"} {
		b.Run(mode, func(b *testing.B) {
			h := newHost(b, wasmhost.Limits{})
			tool := loadTool(b, h, "echo")
			call := wasmhost.ToolCall{Args: args(map[string]string{"text": "hello"})}
			time.Sleep(50 * time.Millisecond) // let the pool fill
			pause := time.Duration(0)
			if mode == "paced" {
				pause = 8 * time.Millisecond
			}
			timeCalls(b, tool, call, pause)
		})
	}
}

// BenchmarkFuelOverhead runs the same CPU-bound loop (misbehave spin, 1e6
// iterations) metered and unmetered in one run and reports the ratio.
func BenchmarkFuelOverhead(b *testing.B) {
	call := wasmhost.ToolCall{Args: args(map[string]any{"mode": "spin", "n": 1_000_000})}
	run := func(disable bool, n int) time.Duration {
		h := newHost(b, wasmhost.Limits{CallFuel: 1 << 40}, func(c *wasmhost.Config) { c.DisableFuel = disable })
		tool := loadTool(b, h, "misbehave")
		var best time.Duration
		for i := 0; i < n; i++ {
			start := time.Now()
			if _, err := tool.Execute(context.Background(), call); err != nil {
				b.Fatal(err)
			}
			if d := time.Since(start); best == 0 || d < best {
				best = d
			}
		}
		return best
	}
	n := b.N
	if n < 5 {
		n = 5
	}
	metered := run(false, n)
	unmetered := run(true, n)
	b.ReportMetric(float64(metered.Microseconds()), "metered-us")
	b.ReportMetric(float64(unmetered.Microseconds()), "unmetered-us")
	b.ReportMetric(float64(metered)/float64(unmetered), "ratio")
}

// BenchmarkInterrupt compares the two deadline mechanisms in one run: the
// CPU loop and the echo call under each, and how late each stops an
// infinite loop with a 200 ms deadline.
func BenchmarkInterrupt(b *testing.B) {
	type result struct{ spin, echo, stop time.Duration }
	measure := func(mode wasmhost.Interrupt) result {
		h := newHost(b, wasmhost.Limits{CallFuel: 1 << 60}, func(c *wasmhost.Config) { c.Interrupt = mode })
		bad := loadTool(b, h, "misbehave")
		echo := loadTool(b, h, "echo")
		var r result
		spin := wasmhost.ToolCall{Args: args(map[string]any{"mode": "spin", "n": 1_000_000})}
		for i := 0; i < 5; i++ {
			start := time.Now()
			if _, err := bad.Execute(context.Background(), spin); err != nil {
				b.Fatal(err)
			}
			if d := time.Since(start); r.spin == 0 || d < r.spin {
				r.spin = d
			}
		}
		var echoes []time.Duration
		for i := 0; i < 50; i++ {
			time.Sleep(8 * time.Millisecond)
			start := time.Now()
			if _, err := echo.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"text": "x"})}); err != nil {
				b.Fatal(err)
			}
			echoes = append(echoes, time.Since(start))
		}
		sort.Slice(echoes, func(i, j int) bool { return echoes[i] < echoes[j] })
		r.echo = echoes[len(echoes)/2]
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		_, _ = bad.Execute(ctx, wasmhost.ToolCall{Args: args(map[string]any{"mode": "loop"})})
		r.stop = time.Since(start)
		cancel()
		return r
	}
	for i := 0; i < b.N; i++ {
		wd := measure(wasmhost.InterruptWatchdog)
		cd := measure(wasmhost.InterruptCloseOnDone)
		b.ReportMetric(float64(wd.spin.Microseconds()), "watchdog-spin-us")
		b.ReportMetric(float64(cd.spin.Microseconds()), "closeondone-spin-us")
		b.ReportMetric(float64(wd.echo.Microseconds()), "watchdog-echo-p50-us")
		b.ReportMetric(float64(cd.echo.Microseconds()), "closeondone-echo-p50-us")
		b.ReportMetric(float64(wd.stop.Milliseconds()), "watchdog-stop-ms")
		b.ReportMetric(float64(cd.stop.Milliseconds()), "closeondone-stop-ms")
	}
}
