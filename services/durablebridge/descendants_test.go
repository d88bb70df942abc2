package durablebridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/subreaper"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// callerEnv makes the test binary a socket caller instead (actAsCaller):
// "<stage>|<socket>|<out file>[|<parent pid to outlive>]".
const callerEnv = "CLAWMESH_DURABLE_TEST_CALLER"

// actAsCaller runs the test binary as a caller of the durable socket when
// callerEnv says so, and reports whether it did. Stage "orphan" starts
// stage "call" in a session of its own (setsid) and exits at once, so the
// caller's parent is gone, as `setsid -f`, a daemon's double fork or
// `cmd & disown` in a shell leave it; stage "call" waits until it is
// orphaned, calls hello and writes the status to the out file.
func actAsCaller() bool {
	v := os.Getenv(callerEnv)
	if v == "" {
		return false
	}
	stage, rest, _ := strings.Cut(v, "|")
	socket, rest, _ := strings.Cut(rest, "|")
	out, parent, _ := strings.Cut(rest, "|")
	switch stage {
	case "orphan":
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), callerEnv+"=call|"+socket+"|"+out+"|"+strconv.Itoa(os.Getpid()))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	case "call", "setsid":
		if pid, err := strconv.Atoi(parent); err == nil {
			for i := 0; i < 500 && processAlive(pid); i++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
		status := "error"
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", socket)
			}}}
		if resp, err := hc.Get("http://durable/session/v1/hello"); err == nil {
			resp.Body.Close()
			status = strconv.Itoa(resp.StatusCode)
		}
		_ = os.WriteFile(out+".tmp", []byte(status), 0o600)
		_ = os.Rename(out+".tmp", out)
		os.Exit(0)
	}
	return false
}

// processAlive reports whether pid runs and is not a zombie.
func processAlive(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(raw), ") ")
	return !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}

// With durable.refuse_descendants, a descendant that calls setsid is
// refused as before (the walk follows parents, not sessions or process
// groups). One whose parent then exits was re-parented to init, out of
// the launcher's tree, and was served: a tool could answer its own ask
// after `setsid -f`. The launcher is its descendants' subreaper now
// (AdoptOrphans), so an orphan stays in its tree and is refused.
func TestCallerRefusedAfterSetsid(t *testing.T) {
	w := newWireBridgeWith(t, false, func(b *Bridge) {
		b.cfg.RefuseDescendants = func() bool { return true }
		b.launcher = os.Getpid() // this test process is the launcher
	})
	w.b.layout.SetReady()
	// As the launcher does (launcher.Run).
	stop, err := subreaper.Start()
	if errors.Is(err, subreaper.ErrNoPidfd) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	call := func(stage string) string {
		out := filepath.Join(t.TempDir(), "status")
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), callerEnv+"="+stage+"|"+w.socket+"|"+out)
		if stage == "setsid" {
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s caller: %v", stage, err)
		}
		var status []byte
		testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
			var err error
			status, err = os.ReadFile(out)
			return err
		})
		return string(status)
	}
	if got := call("setsid"); got != "403" {
		t.Fatalf("a child in a session of its own: %s, want 403", got)
	}
	if got := call("orphan"); got != "403" {
		t.Fatalf("a descendant orphaned after setsid: %s, want 403", got)
	}
}
