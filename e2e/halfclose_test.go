package e2e_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A client that shuts down its sending side while its prompt's turn
// runs, and then closes altogether. The gateway answers what a
// half-closed client sent, so it waits for the turn; once the client is
// gone it saw nothing more (the end of stream was read already) until a
// write to it failed: a turn with nothing to say (a tool, a provider
// thinking, here a minute's sleep) ran on for nobody. Through the real
// binaries the turn now ends, cancelled, within the gateway's poll for a
// hang-up (a second); the jsonrpc package's tests hold the mechanism.
func TestHalfCloseThenHangUpCancelsTheTurn(t *testing.T) {
	t.Parallel()
	// At debug level the gateway logs the end of stream read: the close
	// must come after it, or it is read as a hang-up, seen at once.
	s := e2e.Start(t, e2e.Options{Env: []string{"CLAWMESH_LOG_LEVEL=debug"}})
	v := newConv(t, s, nil)
	const long = "/say start\n/sleep 60000\n/say never"
	const finished = "peer finished sending"
	// This process's connections: its pid is the peer's in the log.
	ours := fmt.Sprintf(`"peer_pid":%d`, os.Getpid())
	halfClosed := func() int {
		n := 0
		for _, line := range strings.Split(readLog(t, s, "gateway"), "\n") {
			if strings.Contains(line, finished) && strings.Contains(line, ours) {
				n++
			}
		}
		return n
	}
	before := halfClosed()

	id := v.newSession("")
	nc, err := net.Dial("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	uc := nc.(*net.UnixConn)
	t.Cleanup(func() { uc.Close() })
	w := newConvOn(t, s, rpcclient.New(uc), nil)
	w.send("session/prompt", map[string]any{"session_id": id, "prompt": long})
	if u, ok := w.upd(w.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("the turn did not start")
	}
	if err := uc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The launcher copies the gateway's output into its log: the line
	// lands a moment after the read it tells of.
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
		if halfClosed() <= before {
			return fmt.Errorf("the gateway has not logged %q for the half-closed client", finished)
		}
		return nil
	})
	st := func() string {
		var st struct{ State string }
		if err := json.Unmarshal(v.call("session/state", map[string]any{"session_id": id}), &st); err != nil {
			t.Fatal(err)
		}
		return st.State
	}
	if got := st(); got != "running" {
		t.Fatalf("the half-closed client's turn is %s, want running: it is answered before the connection closes", got)
	}
	uc.Close()
	// Within 30 s, half the turn's sleep.
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if got := st(); got != "idle" {
			return fmt.Errorf("the turn of a client that half-closed and then hung up is still %s", got)
		}
		return nil
	})
}
