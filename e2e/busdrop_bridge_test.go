package e2e_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
)

// The bus server drops the durable bridge's connection, again and again
// (as it drops a slow consumer, or a flapping network does), while a
// Collie follows a turn: the tool's call and result published meanwhile
// are lost to the bridge, and the turn's next update came with a hole
// in its seqs that nothing noticed. The turn streamed on, so the
// reconcile never saw the pane stand still behind its session, and the
// turn's end left the tool out (a followed turn's tool rows are its
// updates'): the pane showed the turn without its tool, for as long as
// the bridge ran. A hole now has the pane read again from the session
// service at the turn's end.
func TestBridgeBusDropsLoseNothingInThePane(t *testing.T) {
	t.Parallel()
	b := startOnExternalBus(t)
	ph := phone(t, b.s)
	c := b.s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	id, err := newSession(c)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, ph, "the session", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })
	r := post(t, ph, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{
		"text": "/say before\n/sleep 1500\n" + `/tool echo {"x":1}` + strings.Repeat("\n/sleep 300\n/say on", 15) + "\n/say after", "turn": nil})
	if r.Status != http.StatusOK {
		t.Fatalf("send: %s", r)
	}
	eventsUntil(t, ph, id, "the turn followed", func(v collietest.PaneView) bool {
		return v.Turn != nil && strings.Contains(v.Text("reply"), "before")
	})

	// Drop the bridge's bus connection every 10 ms for two and a half
	// seconds, the tool's call and result published within them.
	stop := make(chan struct{})
	kicked := kickWhile(b, "clawmesh-durable-bridge", stop)
	time.Sleep(2500 * time.Millisecond)
	close(stop)
	t.Logf("the bridge's bus connection dropped %d times", <-kicked)

	// Its result shows, as the tool's update says it ("completed: ...")
	// or as the transcript does ("echo: ..."), in the first view that
	// says the turn ended: the pane is read again before it says so, not
	// after (a reader that took the view between kept the hole).
	v := eventsUntil(t, ph, id, "the turn's end", func(v collietest.PaneView) bool { return v.State == "idle" })
	t.Logf("items %+v", v.Items)
	tool, reply := v.Text("tool"), v.Text("reply")
	if !strings.Contains(reply, "after") || strings.Count(reply, "on") != 15 ||
		!strings.Contains(tool, "completed") && !strings.Contains(tool, "echo: ") {
		t.Fatalf("the first view of the ended turn lacks what the drops lost: reply %q, tool %q", reply, tool)
	}
}
