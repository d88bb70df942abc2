package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkSocket/echo/clients=64-2         	  200000	      5000 ns/op	    200000 req/s	       300 p50_us
BenchmarkSocket/health/clients=64-2       	  200000	      6000 ns/op	    170000 req/s	       350 p50_us
BenchmarkSocket/health/clients=64-2       	  200000	      6000 ns/op	    150000 req/s	       350 p50_us
BenchmarkSocket/health/clients=64-2       	  200000	      6000 ns/op	    180000 req/s	       350 p50_us
BenchmarkFuelOverhead-2   	     300	   1 ns/op	 1.7 ratio
BenchmarkIdleFootprint-2   	       3	4947707347 ns/op	        11.25 baseline_MB	        14.84 ratio	       167.0 stack_MB
BenchmarkMachine/page_fault-2         	  100000	     11250 ns/op	         1.000 faults/page	        11.25 us/page
PASS
`

func TestTable(t *testing.T) {
	res, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	met, measured := render(&b, []row{
		{Work: "health", Subject: sel{"BenchmarkSocket/health/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.8},
		{Work: "fuel", Subject: sel{"BenchmarkFuelOverhead", "ratio"}, Target: 1.5, AtMost: true},
		{Work: "absent", Subject: sel{"BenchmarkNothing", "x"}, Target: 1},
		{Work: "footprint", Subject: sel{"BenchmarkIdleFootprint", "stack_MB"}, Baseline: sel{"BenchmarkIdleFootprint", "baseline_MB"}, Target: 100, AtMost: true, Absolute: true},
		{Work: "health again", Subject: sel{"BenchmarkSocket/health/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Scale: true},
		{Work: "page", Subject: sel{"BenchmarkMachine/page_fault", "us/page"}, Scale: true},
	}, res)
	out := b.String()
	// The median of three health runs (170000) over the echo baseline.
	for _, want := range []string{
		"| health | 170000 req/s | 200000 req/s | 0.85× | ≥ 0.80× | ok |",
		"| fuel | 1.70 ratio |  |  | ≤ 1.50 ratio | below target |",
		"| absent | not measured |",
		// An absolute target, the baseline beside it for scale.
		"| footprint | 167 stack_MB | 11.2 baseline_MB | 14.8× | ≤ 100 stack_MB | below target |",
		// A row for scale: no target, not counted.
		"| health again | 170000 req/s | 200000 req/s | 0.85× | — | for scale |",
		// A figure for scale alone: no baseline, no target.
		"| page | 11.2 us/page |  |  | — | for scale |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if met != 1 || measured != 3 {
		t.Errorf("met %d of %d", met, measured)
	}
}

// A figure and its baseline that ran the same number of times are
// compared run by run: the median of the runs' ratios, not the ratio of
// the medians (which here would be 100000/150000 = 0.67).
func TestRatioPairsRuns(t *testing.T) {
	res, err := parse(strings.NewReader(`
BenchmarkSocket/echo/clients=64-2     	1	1 ns/op	200000 req/s
BenchmarkSocket/status/clients=64-2   	1	1 ns/op	170000 req/s
BenchmarkSocket/echo/clients=64-2     	1	1 ns/op	100000 req/s
BenchmarkSocket/status/clients=64-2   	1	1 ns/op	90000 req/s
BenchmarkSocket/echo/clients=64-2     	1	1 ns/op	150000 req/s
BenchmarkSocket/status/clients=64-2   	1	1 ns/op	100000 req/s
`))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	met, _ := render(&b, []row{
		{Work: "status", Subject: sel{"BenchmarkSocket/status/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.8},
	}, res)
	if want := "| status | 100000 req/s | 150000 req/s | 0.85× | ≥ 0.80× | ok |"; !strings.Contains(b.String(), want) || met != 1 {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
}

// A figure that would read as its target without meeting it shows the
// digits that decide it: the ratio 0.249 shows as 0.249×, below ≥ 0.25×,
// and 100.4 MB is 100.4, past ≤ 100; one that is the target or clear of
// it keeps its usual digits.
func TestFigureNearItsTarget(t *testing.T) {
	res, err := parse(strings.NewReader(`
BenchmarkSocket/echo/clients=64-2     	1	1 ns/op	200000 req/s
BenchmarkSocket/status/clients=64-2   	1	1 ns/op	49800 req/s
BenchmarkSocket/state/clients=64-2    	1	1 ns/op	50000 req/s
BenchmarkIdleFootprint-2   	       3	1 ns/op	        11.25 baseline_MB	       100.4 stack_MB
`))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	met, _ := render(&b, []row{
		{Work: "status", Subject: sel{"BenchmarkSocket/status/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.25},
		{Work: "state", Subject: sel{"BenchmarkSocket/state/clients=64", "req/s"}, Baseline: sel{"BenchmarkSocket/echo/clients=64", "req/s"}, Target: 0.25},
		{Work: "footprint", Subject: sel{"BenchmarkIdleFootprint", "stack_MB"}, Baseline: sel{"BenchmarkIdleFootprint", "baseline_MB"}, Target: 100, AtMost: true, Absolute: true},
	}, res)
	out := b.String()
	for _, want := range []string{
		"| status | 49800 req/s | 200000 req/s | 0.249× | ≥ 0.25× | below target |",
		"| state | 50000 req/s | 200000 req/s | 0.25× | ≥ 0.25× | ok |",
		"| footprint | 100.4 stack_MB | 11.2 baseline_MB | 8.92× | ≤ 100 stack_MB | below target |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if met != 1 {
		t.Errorf("met %d, want 1", met)
	}
}
