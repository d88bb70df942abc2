package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// With every sandbox replica gone for good (killed, and not restarted:
// here its binary is taken away, so each restart the launcher tries
// fails), a call through the replicas' client waited out its whole
// deadline for a replica that serves: plugins/list its 5 s, then
// "plugin-sandbox: starting: no replica serves yet (...)", a tool call
// its two minutes. It now fails once no replica has connected for
// grpcclient.RestartGrace, saying that no replica is reachable.
func TestPluginsListSaysNoReplicaIsReachableOnceEverySandboxIsGone(t *testing.T) {
	t.Parallel()
	bin := linkedBinDir(t)
	s := pluginStack(t, []string{"echo"}, "--scale", "plugin-sandbox=2", "--bin-dir", bin)
	v := newConv(t, s, nil)
	listPlugins(t, v)

	if err := os.Remove(filepath.Join(bin, "plugin-sandbox")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		killReplica(t, s, i)
	}
	_, err := v.c.Call("plugins/list", map[string]any{})
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || !strings.HasPrefix(re.Message, "plugin-sandbox: no replica is reachable (") {
		t.Fatalf("plugins/list with every sandbox replica gone: %v", err)
	}
	t.Logf("plugins/list: %v", err)
}

// A sandbox the launcher restarts after a crash is away for a moment
// (its socket refusing, then its start answering NOT_SERVING). Alone
// (one replica, the default stack), it was dialled as by Dial and a
// call in that moment failed at once, "plugin-sandbox unavailable" or
// its start's words; it is now waited for within the call's deadline
// as a set of replicas is, and plugins/list made just after the crash
// is answered by the restarted sandbox.
func TestPluginsListWaitsForTheSandboxRestarting(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"echo"})
	v := newConv(t, s, nil)
	listPlugins(t, v)
	for range 3 {
		killReplica(t, s, 0)
		if l := listPlugins(t, v); len(l.Plugins) != 1 {
			t.Fatalf("plugins/list after the sandbox's restart: %+v", l)
		}
	}
}

// linkedBinDir is a folder of links to the stack's binaries, for
// clawmesh up's --bin-dir: a test may take one away.
func linkedBinDir(t *testing.T) string {
	t.Helper()
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(bin, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// killReplica kills sandbox replica i of s and returns once its process
// is gone (its socket left refusing connections).
func killReplica(t *testing.T, s *e2e.Stack, i int) {
	t.Helper()
	pid := replicaPID(t, s, i)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sock := datadir.ServiceSocket(s.DataDir, "plugin-sandbox", i)
	testenv.Eventually(t, 30*time.Second, time.Millisecond, func() error {
		if syscall.Kill(pid, 0) != nil || procIsZombie(pid) {
			return nil
		}
		return errors.New("replica " + sock + " still runs")
	})
}

// procIsZombie reports whether pid has exited and waits to be reaped.
func procIsZombie(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err != nil || strings.Contains(string(stat), ") Z ")
}

// BenchmarkSandboxRestartAway is how long a supervised restart keeps
// the sandbox away, for grpcclient.RestartGrace: from its kill to its
// socket accepting a connection again (away-ms), and to its health
// serving its calls. Each iteration kills the sandbox of one stack
// (no plugins) as soon as the last restart serves, so the launcher's
// backoff doubles from 100 ms as in a crash loop: -benchtime=Nx, the
// iterations' times are logged in order.
func BenchmarkSandboxRestartAway(b *testing.B) {
	s := e2e.Start(b, e2e.Options{})
	sock := datadir.ServiceSocket(s.DataDir, "plugin-sandbox", 0)
	var away, serving time.Duration
	i := 0
	for b.Loop() {
		i++
		pid := s.PIDOf("plugin-sandbox")
		if pid == 0 {
			b.Fatal("no plugin-sandbox")
		}
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			b.Fatal(err)
		}
		for syscall.Kill(pid, 0) == nil && !procIsZombie(pid) {
			time.Sleep(100 * time.Microsecond)
		}
		var back time.Duration
		for {
			c, err := net.DialTimeout("unix", sock, time.Second)
			if err == nil {
				c.Close()
				back = time.Since(killed)
				break
			}
			if time.Since(killed) > time.Minute {
				b.Fatalf("the sandbox's socket refused for a minute: %v", err)
			}
			time.Sleep(time.Millisecond)
		}
		var up time.Duration
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := callsServing(ctx, sock)
			cancel()
			if err == nil {
				up = time.Since(killed)
				break
			}
			if time.Since(killed) > time.Minute {
				b.Fatalf("the sandbox did not serve for a minute: %v", err)
			}
			time.Sleep(time.Millisecond)
		}
		b.Logf("restart %d: socket back after %v, serving after %v", i, back.Round(time.Millisecond), up.Round(time.Millisecond))
		away += back
		serving += up
	}
	b.ReportMetric(float64(away.Milliseconds())/float64(i), "away-ms")
	b.ReportMetric(float64(serving.Milliseconds())/float64(i), "serving-ms")
}

// callsServing asks the replica on sock whether it serves its calls
// (grpcserver.Calls).
func callsServing(ctx context.Context, sock string) error {
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		return err
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: grpcserver.Calls})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("calls %v", resp.GetStatus())
	}
	return nil
}
