// Command benchtable reads `go test -bench` output and prints one table:
// each figure next to its baseline from the same run, the ratio and the
// target (docs/performance.md says where each target comes from). make
// bench pipes every benchmark through it.
//
//	go test -run '^$' -bench . ./... | go run ./scripts/benchtable
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// sel picks one metric of one benchmark: the benchmark's full name
// (without the -GOMAXPROCS suffix) and the metric's unit.
type sel struct {
	Bench, Unit string
}

// row is one line of the table. With a Baseline the ratio
// Subject/Baseline is held against Target; without one the Subject's own
// value is.
type row struct {
	Work     string
	Subject  sel
	Baseline sel
	Target   float64
	// AtMost: the figure must be at most Target (latencies, overheads);
	// else at least (throughputs).
	AtMost bool
	// Absolute: Target applies to the Subject's own value (MB, ms); the
	// Baseline and the ratio are shown beside it for scale.
	Absolute bool
	// Scale rows have no target: they show what another row's figure
	// rests on (e.g. the same read with nothing shared). They are not
	// counted among the measured rows.
	Scale bool
}

// results maps "bench unit" to the values seen (one per run).
type results map[string][]float64

var suffix = regexp.MustCompile(`-\d+$`)

// parse reads benchmark lines: NAME-N  ITER  VALUE UNIT  VALUE UNIT ...
func parse(r io.Reader) (results, error) {
	out := results{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := suffix.ReplaceAllString(f[0], "")
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			key := name + " " + f[i+1]
			out[key] = append(out[key], v)
		}
	}
	return out, sc.Err()
}

// value is the median of the runs of s.
func (r results) value(s sel) (float64, bool) {
	vs := append([]float64(nil), r[s.Bench+" "+s.Unit]...)
	if len(vs) == 0 {
		return 0, false
	}
	sort.Float64s(vs)
	return vs[len(vs)/2], true
}

// ratio is subject over baseline. When both ran the same number of times
// (go test -count), the i-th figure of each comes from the same run, and
// the ratio is the median of the runs' own ratios: a figure and its
// baseline are only compared within one run. Otherwise it is the ratio of
// the medians.
func (r results) ratio(subject, baseline sel) float64 {
	ss, bs := r[subject.Bench+" "+subject.Unit], r[baseline.Bench+" "+baseline.Unit]
	if len(ss) > 1 && len(ss) == len(bs) {
		var rs []float64
		for i := range ss {
			if bs[i] != 0 {
				rs = append(rs, ss[i]/bs[i])
			}
		}
		if len(rs) == len(ss) {
			sort.Float64s(rs)
			return rs[len(rs)/2]
		}
	}
	now, _ := r.value(subject)
	b, _ := r.value(baseline)
	return now / b
}

func format(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// formatNear is format with up to three more decimals when v would
// otherwise read as target without being it: a ratio of 0.249 against
// ≥ 0.25 reads 0.249, not 0.25 marked below target.
func formatNear(v, target float64) string {
	s := format(v)
	if v == target || s != format(target) {
		return s
	}
	d := 0
	if i := strings.IndexByte(s, '.'); i >= 0 {
		d = len(s) - i - 1
	}
	for more := 1; more <= 3; more++ {
		s = strconv.FormatFloat(v, 'f', d+more, 64)
		if s != strconv.FormatFloat(target, 'f', d+more, 64) {
			break
		}
	}
	return s
}

// render writes the table and returns how many rows meet their target
// and how many were measured.
func render(w io.Writer, rows []row, res results) (met, measured int) {
	fmt.Fprintln(w, "| work | now | baseline | ratio | target | |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rows {
		now, ok := res.value(r.Subject)
		if !ok {
			fmt.Fprintf(w, "| %s | not measured | | | | |\n", r.Work)
			continue
		}
		if !r.Scale {
			measured++
		}
		figure, base, ratio := now, "", ""
		if r.Baseline.Bench != "" {
			b, ok := res.value(r.Baseline)
			if !ok || b == 0 {
				fmt.Fprintf(w, "| %s | %s %s | not measured | | | |\n", r.Work, format(now), r.Subject.Unit)
				if !r.Scale {
					measured--
				}
				continue
			}
			base = format(b) + " " + r.Baseline.Unit
			q := res.ratio(r.Subject, r.Baseline)
			ratio = format(q) + "×"
			if !r.Absolute {
				figure = q
			}
		}
		if r.Scale {
			fmt.Fprintf(w, "| %s | %s %s | %s | %s | — | for scale |\n", r.Work, format(now), r.Subject.Unit, base, ratio)
			continue
		}
		cmp, ok := "≥", figure >= r.Target
		if r.AtMost {
			cmp, ok = "≤", figure <= r.Target
		}
		// The compared figure shows the digits that decide it.
		shown := format(now)
		if r.Baseline.Bench != "" && !r.Absolute {
			ratio = formatNear(figure, r.Target) + "×"
		} else {
			shown = formatNear(now, r.Target)
		}
		target := cmp + " " + format(r.Target)
		if r.Baseline.Bench != "" && !r.Absolute {
			target += "×"
		} else {
			target += " " + r.Subject.Unit
		}
		mark := "below target"
		if ok {
			mark, met = "ok", met+1
		}
		fmt.Fprintf(w, "| %s | %s %s | %s | %s | %s | %s |\n", r.Work, shown, r.Subject.Unit, base, ratio, target, mark)
	}
	return met, measured
}

func main() {
	res, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	met, measured := render(os.Stdout, Rows, res)
	fmt.Printf("\n%d of %d measured rows at or past their target (%d rows in all)\n", met, measured, len(Rows))
}
