package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The durable bridge restarts in the middle of an ask: the new start has
// a new epoch and is not ready (every route 503 starting) until every
// conversation is shown again and the ask is raised again under the same
// id; the phone's answer, sent across the restart with its request id,
// lands. The session service is held stopped (SIGSTOP) while the bridge
// restarts, so the not-ready window is there for the test to see.
func TestDurableRestartMidAsk(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: approvalArgs})
	c := phone(t, s)
	ctx := context.Background()
	id := paneOfNewSession(t, s, c)

	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": `/tool echo {"r":1}` + "\n/say landed"}), http.StatusOK, "")
	a := openAsk(t, c, id)
	eventsUntil(t, c, id, "the ask", func(v collietest.PaneView) bool { _, ok := v.Asks[a.ID]; return ok })
	epoch := c.Hello.Epoch

	session := s.PIDOf("session")
	bridge := s.PIDOf("durable-bridge")
	if session == 0 || bridge == 0 {
		t.Fatalf("pids: session %d, durable-bridge %d", session, bridge)
	}
	if err := syscall.Kill(session, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(session, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	if err := syscall.Kill(bridge, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	// The new start: another epoch, not ready, every route but hello
	// refused with 503 starting, the phone's answer too (not remembered).
	var h *collietest.Hello
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() error {
		var err error
		if h, err = c.SayHello(ctx); err != nil {
			return err
		}
		if h.Epoch == epoch {
			return fmt.Errorf("still the old epoch")
		}
		return nil
	})
	if h.Ready || len(h.Epoch) < 32 {
		t.Fatalf("hello of the new start while the sessions cannot be read: %+v", h)
	}
	if _, r, err := c.Poll(ctx); err == nil || r == nil || r.Status != http.StatusServiceUnavailable || r.Code() != "starting" {
		t.Fatalf("snapshot before ready: %v %v", r, err)
	}
	answerID := collietest.NewRequestID()
	r, err := c.Answer(ctx, id, answerID, a, "allow_once")
	if err != nil || r.Status != http.StatusServiceUnavailable || r.Code() != "starting" {
		t.Fatalf("answer before ready: %v %v", r, err)
	}

	resume()
	waitReady(t, c)
	// Ready means the ask is there again, under the same id, at once.
	if changed, r, err := c.Poll(ctx); err != nil || !changed {
		t.Fatalf("first snapshot of the new epoch: %v %v", r, err)
	}
	p := c.Snap.Pane(id)
	if c.Snap.Epoch == epoch || p == nil || len(p.Asks) != 1 || p.Asks[0].ID != a.ID || p.State != "waiting" {
		t.Fatalf("pane after the restart: %+v (epoch %s)", p, c.Snap.Epoch)
	}
	// The old cursor is of another epoch: the pane's whole view.
	page, err := c.Events(ctx, id)
	if err != nil || !page.Reset || page.Epoch == epoch || len(page.Asks) != 1 || page.Asks[0].ID != a.ID {
		t.Fatalf("events after the restart: %+v %v", page, err)
	}

	// The answer sent across the restart lands: same request id, same ask.
	r, err = c.Answer(ctx, id, answerID, a, "allow_once")
	if err != nil || r.Status != http.StatusOK || string(r.Body) != `{"ok":true,"outcome":{"option":"allow_once"}}` {
		t.Fatalf("answer across the restart: %v %v", r, err)
	}
	v := eventsUntil(t, c, id, "the turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "landed")
	})
	if !strings.Contains(v.Text("tool"), `completed: {"r":1}`) || len(v.Closed) != 1 || v.Closed[0].By != "phone" {
		t.Fatalf("after the answer: %q %+v", v.Text("tool"), v.Closed)
	}
}

// A socket path through a symbolic link, or in a folder others may write,
// is refused when the bridge starts, and the stack does not come up; the
// bridge's log says which part failed.
func TestDurableSocketRefused(t *testing.T) {
	t.Parallel()
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("", "cm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	target := filepath.Join(base, "target")
	group := filepath.Join(base, "group")
	for _, d := range []string{target, group} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(group, 0o770); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, socket, why string
	}{
		{"symlink", filepath.Join(base, "link", "durable.sock"), filepath.Join(base, "link") + " is a symbolic link"},
		{"group", filepath.Join(group, "durable.sock"), "has mode 0770; it must be 0700"},
	} {
		dir := filepath.Join(base, "data-"+c.name)
		t.Cleanup(func() { os.RemoveAll(pgcluster.Dir(dir)) })
		_, err := e2e.LaunchEnv(t, bin, dir, []string{"COLLIE_DURABLE_SOCKET=" + c.socket})
		if err == nil || !strings.Contains(err.Error(), "durable-bridge exited during start") {
			t.Fatalf("%s: the stack came up, or failed otherwise: %v", c.name, err)
		}
		log, _ := os.ReadFile(filepath.Join(dir, "logs", "durable-bridge.log"))
		if !strings.Contains(string(log), "durable socket is not private") || !strings.Contains(string(log), c.why) {
			t.Fatalf("%s: the log does not say why:\n%s", c.name, log)
		}
		if _, err := os.Lstat(c.socket); err == nil {
			t.Fatalf("%s: a socket was made at %s", c.name, c.socket)
		}
	}
}
