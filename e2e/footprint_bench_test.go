package e2e_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
)

// settle is how long a stack idles before its memory is read: start-up
// garbage is collected and the runtime has returned what it scavenges.
const settle = 3 * time.Second

// BenchmarkIdleFootprint reports the summed resident memory of an idle
// stack's own processes (the launcher, which holds the embedded NATS
// server, the gateway and the services a fresh stack runs, the durable
// bridge and upload-staging being dormant; PostgreSQL aside) after one
// client initialized, next to a bare Go gRPC server with health and
// reflection (internal/e2e/baselinegrpc) measured in the same run.
// Reported: stack_MB, baseline_MB, and the stack's per-process figures in
// the log.
func BenchmarkIdleFootprint(b *testing.B) {
	baseline, _ := startBaselineGRPC(b)
	var stackMB, baseMB []float64
	for range b.N {
		s := e2e.Start(b, e2e.Options{PrivateCluster: true})
		c := s.Dial(b)
		if _, err := c.Initialize(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(settle)
		var sum int64
		var parts []string
		for pid, name := range stackPIDs(s) {
			rss := rssKB(pid)
			sum += rss
			parts = append(parts, fmt.Sprintf("%s %.1f", name, float64(rss)/1024))
		}
		sort.Strings(parts)
		b.Logf("RSS MB: %s", strings.Join(parts, ", "))
		stackMB = append(stackMB, float64(sum)/1024)
		baseMB = append(baseMB, float64(rssKB(baseline))/1024)
		c.Close()
		s.Stop()
	}
	b.ReportMetric(median(stackMB), "stack_MB")
	b.ReportMetric(median(baseMB), "baseline_MB")
	b.ReportMetric(median(stackMB)/median(baseMB), "ratio")
}

// BenchmarkStartup times `clawmesh up` on an existing data directory
// until a client's initialize succeeds (startup_ms), next to the start of
// the same PostgreSQL cluster alone until it accepts a connection
// (pg_start_ms), alternating, in the same run. first_run_ms is the
// median of firstRuns starts on new data directories, initdb included
// (first_run_min_ms and first_run_max_ms beside it); the last of them is
// the existing data directory of the other starts.
func BenchmarkStartup(b *testing.B) {
	var firsts []float64
	var dir string
	for range firstRuns {
		dir = e2e.TempDataDir(b)
		// The writes of what ran before (make bench runs this after the
		// upload's files and three idle stacks; here, after the last
		// first start) are flushed first, not while initdb writes its
		// cluster: left pending they added up to 0.9 s to a first
		// start.
		syscall.Sync()
		first, s := timeUp(b, dir)
		s.Stop()
		firsts = append(firsts, ms(first))
		cluster := dir
		b.Cleanup(func() {
			if pg := pgcluster.Dir(cluster); pg != "" && !strings.HasPrefix(pg, cluster+"/") {
				os.RemoveAll(pg)
			}
		})
	}
	var up, pg []float64
	for range b.N {
		pg = append(pg, ms(timePostgres(b, dir)))
		d, s := timeUp(b, dir)
		up = append(up, ms(d))
		s.Stop()
	}
	b.ReportMetric(median(firsts), "first_run_ms")
	b.ReportMetric(slices.Min(firsts), "first_run_min_ms")
	b.ReportMetric(slices.Max(firsts), "first_run_max_ms")
	b.ReportMetric(median(up), "startup_ms")
	b.ReportMetric(median(pg), "pg_start_ms")
	b.ReportMetric(median(up)/median(pg), "ratio")
}

// firstRuns is how many first starts BenchmarkStartup times. One was
// the table's only figure taken once: 28 first starts, each alone in a
// test process, spread over 1.31 to 1.99 s (thirty-fourth round,
// docs/performance.md), as wide as the row's margin. Three, as the
// socket's and the turn stream's rows run, and their median.
const firstRuns = 3

// timeUp starts the stack on dir and returns the time until a client's
// initialize succeeded.
func timeUp(b *testing.B, dir string) (time.Duration, *e2e.Stack) {
	bin, err := e2e.BinDir()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	s, err := e2e.Launch(b, bin, dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	for {
		c, err := e2e.Dial(s.Socket)
		if err == nil {
			_, err = c.Initialize()
			c.Close()
			if err == nil {
				return time.Since(start), s
			}
		}
		if time.Since(start) > 60*time.Second {
			s.Stop()
			b.Fatalf("no initialize within 60 s: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// timePostgres starts the data directory's cluster alone and returns the
// time until it accepts a connection, then stops it.
func timePostgres(b *testing.B, dir string) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := pgcluster.Prepare(ctx, pgcluster.Options{Dir: pgcluster.Dir(dir), PasswordFile: filepath.Join(dir, "postgres.password")})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	cmd := p.Command()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(pgcluster.ShutdownSignal)
		<-exited
	}()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_, err := p.Probe(pctx)
		pcancel()
		if err == nil {
			return time.Since(start)
		}
		select {
		case <-exited:
			b.Fatalf("postgres exited: %v", err)
		case <-ctx.Done():
			b.Fatalf("postgres not ready: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

// stackPIDs are the launcher and the processes it started for the stack,
// PostgreSQL's aside.
func stackPIDs(s *e2e.Stack) map[int]string {
	out := map[int]string{s.LauncherPID(): "clawmesh"}
	for pid, name := range s.PIDs() {
		if name != "postgres" && !strings.HasPrefix(name, "postgres:") {
			out[pid] = name
		}
	}
	return out
}

// rssKB reads a process's resident set from /proc/<pid>/status.
func rssKB(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// startBaselineGRPC builds and starts internal/e2e/baselinegrpc and
// returns its pid and socket once it serves.
func startBaselineGRPC(b *testing.B) (pid int, sock string) {
	dir := b.TempDir()
	exe := filepath.Join(dir, "baselinegrpc")
	if out, err := exec.Command("go", "build", "-o", exe, "github.com/clawmesh/clawmesh/internal/e2e/baselinegrpc").CombinedOutput(); err != nil {
		b.Fatalf("build baselinegrpc: %v\n%s", err, out)
	}
	sock = filepath.Join(dir, "g.sock")
	cmd := exec.Command(exe, sock)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGKILL); _ = cmd.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if i > 5000 {
			b.Fatal("baselinegrpc did not start")
		}
		time.Sleep(time.Millisecond)
	}
	return cmd.Process.Pid, sock
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
