package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// hang stops process pid (SIGSTOP), as a hung process is: it keeps its
// sockets, and what connects waits in their backlogs. resume lets it run
// again (SIGCONT); the test's cleanup does if the test has not.
func hang(t *testing.T, pid int) (resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) })
	return func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The config service hung (SIGSTOP): initialize asked it who the caller
// was, so that a new connection could not even ask health or status
// (both failed after 9 s with "config unavailable"), exactly when the
// operator needed to see what was wrong. The operator (the stack's own
// uid, no token) is now bound without config, the initialize result
// saying so; health and status answer, showing config unreachable; a
// token is still config's to check; once config answers again a new
// connection is resolved by it.
func TestOperatorInitializesWhileConfigIsHung(t *testing.T) {
	t.Parallel()
	// The launcher would replace the hung process after its liveness
	// limit: keep it stopped for the test.
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "10m", "--set", "rpc.call_timeout_ms=3000"}})
	watcher := s.Dial(t)
	if _, err := watcher.Initialize(); err != nil {
		t.Fatal(err)
	}
	pid := s.PIDOf("config")
	if pid == 0 {
		t.Fatalf("no config process among %v", s.PIDs())
	}
	resume := hang(t, pid)
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() error {
		h, err := healthOf(watcher)
		if err != nil {
			return err
		}
		if h["config"].Status != "unreachable" {
			return fmt.Errorf("config is %q", h["config"].Status)
		}
		return nil
	})

	c := s.Dial(t)
	init, err := c.Initialize()
	if err != nil {
		t.Fatalf("the operator's initialize with config stopped: %v", err)
	}
	if init["principal_id"] != "shared-operator" || init["config_unavailable"] == nil {
		t.Fatalf("initialize with config stopped: %v", init)
	}
	h, err := healthOf(c)
	if err != nil || h["config"].Status != "unreachable" {
		t.Fatalf("health with config stopped: %v, %v", h, err)
	}
	raw, err := c.Call("status", map[string]any{})
	if err != nil {
		t.Fatalf("status with config stopped: %v", err)
	}
	var st struct {
		Services map[string]string `json:"services"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.Services["config"] != "unreachable" {
		t.Fatalf("status with config stopped: %s, %v", raw, err)
	}
	// The CLI says the same: clawmesh status names config, exit 1.
	out, err := exec.Command(filepath.Join(s.BinDir, "clawmesh"), "status", "--socket", s.Socket).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "not every service is serving: config unreachable") {
		t.Fatalf("clawmesh status with config stopped: %v\n%s", err, out)
	}
	// clawmesh doctor names the stopped service, where it could not
	// initialize.
	if dout, _ := doctor(t, s.BinDir, s.DataDir); !strings.Contains(dout, "FAIL  config             unreachable") {
		t.Fatalf("clawmesh doctor with config stopped:\n%s", dout)
	}
	// Another uid is no operator: it reaches the socket (through a link
	// the test opens to it) and still fails initialize.
	if os.Getuid() == 0 {
		out, err := asNobody(t, s, "status")
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "config timed out") {
			t.Fatalf("clawmesh status as uid 65534 with config stopped: %v\n%s", err, out)
		}
	}
	// A token is config's to check: no fallback to the operator.
	tok := s.Dial(t)
	if _, err := tok.Initialize("cmt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"); err == nil {
		t.Fatal("a token was bound with config stopped")
	} else if re := (*e2e.RPCError)(nil); !errors.As(err, &re) || re.Code != -32603 {
		t.Fatalf("initialize with a token, config stopped: %v", err)
	}

	resume()
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
		if st, err := procstat.Read(pid); err == nil && st.State == 'T' {
			return errors.New("config still stopped")
		}
		again := s.Dial(t)
		defer again.Close()
		init, err := again.Initialize()
		if err != nil {
			return err
		}
		if _, ok := init["config_unavailable"]; ok {
			return fmt.Errorf("still bound without config: %v", init)
		}
		return nil
	})
}

// asNobody runs clawmesh args as uid 65534 on the stack's socket, reached
// through a hard link in a folder of the test's that uid may enter (the
// data folder is 0700). The socket's mode is opened while it runs.
func asNobody(t *testing.T, s *e2e.Stack, args ...string) ([]byte, error) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cm-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "daemon.sock")
	if err := os.Link(s.Socket, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(link, 0o666); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(s.Socket, 0o600) //nolint:errcheck // the same inode
	bin := filepath.Join(dir, "clawmesh")
	src, err := os.Open(filepath.Join(s.BinDir, "clawmesh"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	// The copy's write descriptor, closed above, may still be open in a
	// child another test's goroutine is forking at that moment (between
	// its fork and its exec): the exec then fails "text file busy"
	// (ETXTBSY, Go issue 22315) until that child has exec'd. It is tried
	// again for a while.
	for try := 0; ; try++ {
		cmd := exec.Command(bin, append(args, "--socket", link)...)
		cmd.Env = []string{"HOME=/", "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if errors.Is(err, syscall.ETXTBSY) && try < 100 {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return out, err
	}
}

// The gateway killed (or crashed) while the config service hung: the
// launcher restarted it, and it waited 60 s for config's rpc.* and
// failed, again and again, so that no client got an answer, the
// operator asking status included. It now listens on the defaults of
// rpc.* and binds the operator without config; once config answers
// with other rpc.* (rpc.call_timeout_ms here) it stops and the launcher
// starts it again on them, and new connections are config's again.
func TestGatewayRestartedWhileConfigIsHung(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "10m", "--set", "rpc.call_timeout_ms=3000"}})
	cfg, gw := s.PIDOf("config"), s.PIDOf("gateway")
	if cfg == 0 || gw == 0 {
		t.Fatalf("no config or gateway among %v", s.PIDs())
	}
	resume := hang(t, cfg)
	if err := syscall.Kill(gw, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var fallback int
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		fallback = s.PIDOf("gateway")
		if fallback == 0 || fallback == gw {
			return errors.New("the gateway is not started again yet")
		}
		c := s.Dial(t)
		defer c.Close()
		init, err := c.Initialize()
		if err != nil {
			return err
		}
		if init["principal_id"] != "shared-operator" || init["config_unavailable"] == nil {
			return fmt.Errorf("initialize with config stopped: %v", init)
		}
		raw, err := c.Call("status", map[string]any{})
		if err != nil {
			return err
		}
		var st struct {
			Services map[string]string `json:"services"`
		}
		if err := json.Unmarshal(raw, &st); err != nil || st.Services["config"] != "unreachable" {
			return fmt.Errorf("status with config stopped: %s, %v", raw, err)
		}
		return nil
	})

	resume()
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		if pid := s.PIDOf("gateway"); pid == fallback || pid == 0 {
			return errors.New("the gateway on the defaults still runs")
		}
		c := s.Dial(t)
		defer c.Close()
		init, err := c.Initialize()
		if err != nil {
			return err
		}
		if _, ok := init["config_unavailable"]; ok {
			return fmt.Errorf("still bound without config: %v", init)
		}
		return nil
	})
}

// The session service killed (or crashed) while the config service
// hung: the launcher restarted it, and it waited 60 s for config's live
// document and exited, again and again, its health saying only
// "starting: setting up its services". It now waits for config as long
// as it takes, health saying so, and serves once config answers, the
// same process.
func TestSessionRestartedWhileConfigIsHung(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "10m"}})
	watcher := s.Dial(t)
	if _, err := watcher.Initialize(); err != nil {
		t.Fatal(err)
	}
	cfg, sess := s.PIDOf("config"), s.PIDOf("session")
	if cfg == 0 || sess == 0 {
		t.Fatalf("no config or session among %v", s.PIDs())
	}
	resume := hang(t, cfg)
	if err := syscall.Kill(sess, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var restarted int
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		restarted = s.PIDOf("session")
		if restarted == 0 || restarted == sess {
			return errors.New("the session service is not started again yet")
		}
		h, err := healthOf(watcher)
		if err != nil {
			return err
		}
		c, why := h["session"], ""
		if c.LastError != nil {
			why = *c.LastError
		}
		if c.Status != "not_serving" || why != "starting: waiting for the config service" {
			return fmt.Errorf("session with config stopped: %s %q (restarts %d)", c.Status, why, c.RestartCount)
		}
		return nil
	})
	// A call routed to it meanwhile says what it waits for: it read
	// "session unavailable", as if the session service were down.
	_, err := watcher.Call("session/new", map[string]any{})
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || re.Code != -32603 || re.Message != "session: starting: waiting for the config service" {
		t.Fatalf("session/new while the session service waits for config: %v", err)
	}

	resume()
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		h, err := healthOf(watcher)
		if err != nil {
			return err
		}
		if h["session"].Status != "serving" {
			return fmt.Errorf("session with config back: %+v", h["session"])
		}
		return nil
	})
	if pid := s.PIDOf("session"); pid != restarted {
		t.Fatalf("the session service was started again (%d, then %d) rather than waiting", restarted, pid)
	}
}

// upload-staging sleeps until the first file method wakes it, the
// launcher handing it its socket with the waking call in the backlog.
// Woken while the config service hung, it waited for config without
// answering anything on that socket: the call waited unanswered, then
// failed without naming config. Past a moment of waiting it now answers,
// saying what it waits for, and serves the same call once config is
// back.
func TestUploadStagingWokenWhileConfigIsHung(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--liveness-timeout", "10m"}})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Call("session/new", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(raw, &sess); err != nil {
		t.Fatal(err)
	}
	if pid := s.PIDOf("upload-staging"); pid != 0 {
		t.Fatalf("upload-staging runs before any file method (pid %d)", pid)
	}
	resume := hang(t, s.PIDOf("config"))
	begin := map[string]any{"session_id": sess.SessionID, "size_bytes": 3, "filename": "a.txt"}
	_, err = c.Call("file/upload/begin", begin)
	var re *rpcclient.RPCError
	if !errors.As(err, &re) || re.Code != -32603 || re.Message != "upload-staging: starting: waiting for the config service" {
		t.Fatalf("file/upload/begin waking upload-staging with config hung: %v", err)
	}

	resume()
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() error {
		_, err := c.Call("file/upload/begin", begin)
		return err
	})
}
