package e2e_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// xRuns are the long runs of x of a big tool output, left out of a
// failure's message.
var xRuns = regexp.MustCompile(`x{16,}`)

// itemTimes is each item's time, by id.
func itemTimes(t *testing.T, v collietest.PaneView) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, it := range v.Items {
		at, err := time.Parse(time.RFC3339Nano, it.At)
		if err != nil {
			t.Fatalf("item %s at %q: %v", it.ID, it.At, err)
		}
		out[it.ID] = at
	}
	return out
}

// A finished pane rebuilt at the bridge's next start shows what its
// follower saw: a turn whose events a context trim covered keeps its
// thinking, a tool's output is cut where the follower's was (the
// session's kept bound, 16 KiB, with its note), and each item carries the
// time its first event came, not the time of the row the turn wrote
// later, and the trim's notice comes back where the follower showed it
// (the turn that trimmed records it). Before, the trimmed turn came back
// as its rows (no thinking), and without the notice,
// the tool's output as 16 KiB where the follower had 32, and the second
// turn's reply at the time of its prompt's row, 1.5 s early. The phone
// reads the first turn once it ended: at load, a read that took the
// turn's reply and tool call at once showed the call first (the reply
// grew after it), where the rebuilt pane shows the reply first.
func TestDurablePaneRebuiltAsFollowedAfterTrim(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"misbehave"}, "--set", "agents.default.context_budget_tokens=60")
	c := phone(t, s)
	zc := newConv(t, s, nil)
	probe := zc.newSession("")
	testenv.Eventually(t, 90*time.Second, 200*time.Millisecond, func() error {
		_, results, _ := toolTurn(t, zc, probe, `/tool misbehave {"mode":"repeat","text":"ok","n":2}`)
		if len(results) != 1 || results[0].RawOutput != "okok" {
			return fmt.Errorf("misbehave not served yet: %+v", results)
		}
		return nil
	})
	id := zc.newSession("")
	pollUntil(t, c, "the pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })

	// The phone reads the first turn only once it ended, as a phone late
	// at load did (its reads fell between the turn's reply and its tool
	// call at times, or after both): another reader waits for the end.
	eventsUntil(t, c, id, "the pane's view", func(v collietest.PaneView) bool { return v.Epoch != "" })
	watcher := phone(t, s)
	first := "/think weighing the first\n/sleep 1500\n/say first reply\n" + `/tool misbehave {"mode":"repeat","text":"x","n":24576}` + "\n/say after the tool"
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": first}), http.StatusOK, "")
	eventsUntil(t, watcher, id, "the first turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "after the tool")
	})
	eventsUntil(t, c, id, "the first turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "after the tool")
	})
	// The second turn's context passes the budget: the first turn is
	// trimmed from it.
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": "/think weighing the second\n/sleep 1500\n/say second reply"}), http.StatusOK, "")
	followed := eventsUntil(t, c, id, "the second turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "second reply")
	})
	want := shown(followed)
	if !strings.Contains(want, "weighing the first") || !strings.Contains(want, "weighing the second") || !strings.Contains(want, "Older history was trimmed") {
		t.Fatalf("the followed pane:\n%s", xRuns.ReplaceAllString(want, "x…"))
	}
	if tool := followed.Text("tool"); !strings.Contains(tool, "\n[tool output truncated: 16384 of 24576 bytes kept]") {
		t.Errorf("the followed tool item, %d bytes, is not cut at the kept bound: %s", len(tool), xRuns.ReplaceAllString(tool, "x…"))
	}

	epoch := restartBridge(t, s, c)
	rebuilt := eventsUntil(t, c, id, "the view of the new start", func(v collietest.PaneView) bool { return v.Epoch != epoch })
	if got := shown(rebuilt); got != want {
		t.Errorf("rebuilt pane:\n%s\nfollowed:\n%s", xRuns.ReplaceAllString(got, "x…"), xRuns.ReplaceAllString(want, "x…"))
	}
	sameTimes(t, followed, rebuilt)
}

// A phone that reads a pane's events late (at load, or after a gap)
// gets each item where the pane has it, as a pane rebuilt from the store
// shows it: before, an item that grew after a later item was put came at
// the view's end, where it last grew, so a turn's reply, which grows on
// after its tool call, came after the call (the followed pane of
// TestDurablePaneRebuiltAsFollowedAfterTrim at load, in two CI runs of
// four). The phone reads before the turn and once after its end; another
// reader waits for the end.
func TestDurableLateReaderSeesItemsInTheStoresOrder(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c, watcher := phone(t, s), phone(t, s)
	id := paneOfNewSession(t, s, c)
	eventsUntil(t, c, id, "the pane's view", func(v collietest.PaneView) bool { return v.Epoch != "" })
	script := "/think weighing it\n/sleep 300\n/say first reply\n" + `/tool echo {"x":1}` + "\n/say after the tool\n/think again"
	wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": script}), http.StatusOK, "")
	eventsUntil(t, watcher, id, "the turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "after the tool")
	})
	late := eventsUntil(t, c, id, "the turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "after the tool")
	})
	if late.Resets != 1 {
		t.Fatalf("the late reader took %d views, not its events", late.Resets)
	}
	var kinds []string
	for _, it := range late.Items {
		kinds = append(kinds, it.Kind)
	}
	if got := strings.Join(kinds, " "); got != "user thinking reply tool" {
		t.Errorf("the late reader's items: %s\n%s", got, shown(late))
	}
	epoch := restartBridge(t, s, c)
	rebuilt := eventsUntil(t, c, id, "the view of the new start", func(v collietest.PaneView) bool { return v.Epoch != epoch })
	if got, want := shown(rebuilt), shown(late); got != want {
		t.Errorf("rebuilt pane:\n%s\nread late:\n%s", got, want)
	}
}

// sameTimes fails unless each item of rebuilt carries the time followed
// showed it at, or one close to it: the follower's is when the bridge
// took the update, the rebuilt one's when the session recorded it.
func sameTimes(t *testing.T, followed, rebuilt collietest.PaneView) {
	t.Helper()
	live, again := itemTimes(t, followed), itemTimes(t, rebuilt)
	for _, it := range rebuilt.Items {
		was, ok := live[it.ID]
		if !ok {
			t.Errorf("item %s (%s) rebuilt, not followed", it.ID, it.Kind)
			continue
		}
		if d := again[it.ID].Sub(was); d > 500*time.Millisecond || d < -500*time.Millisecond {
			t.Errorf("item %s (%s) at %s rebuilt, %s followed", it.ID, it.Kind, again[it.ID].Format(time.RFC3339Nano), was.Format(time.RFC3339Nano))
		}
	}
}

// A turn that streams its thoughts across the bridge's restart shows
// them whole once followed to its end, as a follower that never left saw
// them, and a finished pane rebuilt shows each item at the time it was
// followed. Before, the thinking showed at the time of the turn's reply
// row, seconds later, and the chunks streamed between the session's
// checkpoint write (TurnEvents) and the view the bridge read after it
// were in neither: covered by the view's seq, absent from the events.
func TestDurableRunningThoughtsWholeAcrossRestart(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c := phone(t, s)
	zc := newConv(t, s, nil)
	followed, rebuilt := zc.newSession(""), zc.newSession("")
	pollUntil(t, c, "the panes", func(s *collietest.Snapshot) bool { return s.Pane(followed) != nil && s.Pane(rebuilt) != nil })

	var script strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&script, "/think t%d \n/sleep 3\n", i)
	}
	script.WriteString("/say done")
	wantReply(t, post(t, c, "/pane/"+followed+"/send", collietest.NewRequestID(), map[string]any{"text": script.String()}), http.StatusOK, "")
	fv := eventsUntil(t, c, followed, "the followed turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "done")
	})
	want := fv.Text("thinking")
	if !strings.Contains(want, "t999 ") {
		t.Fatalf("followed thinking: %.200q", want)
	}

	wantReply(t, post(t, c, "/pane/"+rebuilt+"/send", collietest.NewRequestID(), map[string]any{"text": script.String()}), http.StatusOK, "")
	eventsUntil(t, c, rebuilt, "the turn streaming", func(v collietest.PaneView) bool { return strings.Contains(v.Text("thinking"), "t100 ") })
	epoch := restartBridge(t, s, c)
	// The finished turn, rebuilt: its thinking item at its first
	// thought's time, seconds before the reply row the turn wrote at its
	// end (which it carried before).
	again := eventsUntil(t, c, followed, "the view of the new start", func(v collietest.PaneView) bool { return v.Epoch != epoch })
	if got, want := shown(again), shown(fv); got != want {
		t.Errorf("finished turn rebuilt:\n%.2000s\nfollowed:\n%.2000s", got, want)
	}
	sameTimes(t, fv, again)
	rv := eventsUntil(t, c, rebuilt, "the rebuilt turn's end", func(v collietest.PaneView) bool {
		return v.State == "idle" && strings.Contains(v.Text("reply"), "done")
	})
	got := rv.Text("thinking")
	if got != want {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Errorf("thinking across the restart: %d bytes, followed %d; first difference at %d: %.80q, followed %.80q",
			len(got), len(want), i, got[i:], want[i:])
	}
}

// A pane rebuilt at the bridge's next start keeps the items its follower
// kept, however many transcript rows they took: a turn that says a line
// before each of its tool calls writes two rows a call (the line, the
// call's result) where its pane shows one item a call and one reply.
// Before, the rebuilt pane read the newest 2,000 rows and no more: after
// 32 such turns (2,048 rows, 1,056 items) the first turn, wholly before
// those rows, and the prompt of the second were missing from it, where
// the followed pane, well under its 2,000 items, showed them.
func TestDurablePaneRebuiltKeepsTheFollowedItemsOfManyRows(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c := phone(t, s)
	id := paneOfNewSession(t, s, c)
	eventsUntil(t, c, id, "the pane's view", func(v collietest.PaneView) bool { return v.Epoch != "" })

	send := func(script, done string) collietest.PaneView {
		t.Helper()
		wantReply(t, post(t, c, "/pane/"+id+"/send", collietest.NewRequestID(), map[string]any{"text": script}), http.StatusOK, "")
		return eventsUntil(t, c, id, done, func(v collietest.PaneView) bool {
			return v.State == "idle" && strings.Contains(v.Text("reply"), done)
		})
	}
	send("/say the first turn", "the first turn")
	var followed collietest.PaneView
	for turn := range 32 {
		var script strings.Builder
		for call := range 31 {
			fmt.Fprintf(&script, "/say line %d.%d\n/tool echo {\"call\":%d}\n", turn, call, call)
		}
		fmt.Fprintf(&script, "/say turn %d done", turn)
		followed = send(script.String(), fmt.Sprintf("turn %d done", turn))
	}
	want := shown(followed)
	if n := len(followed.Items); n < 1000 || n >= 2000 || !strings.Contains(want, "the first turn") {
		t.Fatalf("the followed pane has %d items:\n%.400s", n, want)
	}

	epoch := restartBridge(t, s, c)
	rebuilt := eventsUntil(t, c, id, "the view of the new start", func(v collietest.PaneView) bool { return v.Epoch != epoch })
	if got := shown(rebuilt); got != want {
		t.Errorf("rebuilt pane: %d items, followed %d; rebuilt starts:\n%.400s\nfollowed starts:\n%.400s",
			len(rebuilt.Items), len(followed.Items), got, want)
	}
}
