package session

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// resend asks Resend for session id's updates after after up to upto,
// of the session's incarnation now, and decodes what it sends as a
// gateway would (each past the one before, the last its upto_seq).
func (h *harness) resend(id string, after, upto int64) (*sessionv1.ResendResponse, []update) {
	h.t.Helper()
	incarnation := h.incarnation(id)
	resp, err := h.srv.Resend(context.Background(), &sessionv1.ResendRequest{SessionId: id, Incarnation: incarnation, AfterSeq: after, UptoSeq: upto})
	if err != nil {
		h.t.Fatalf("resend after %d up to %d: %v", after, upto, err)
	}
	var us []update
	last := after
	for _, b := range resp.GetUpdates() {
		u, err := bus.DecodeSessionUpdate(b, id, incarnation)
		if err != nil {
			h.t.Fatalf("resent update: %v", err)
		}
		if u.Seq <= last {
			h.t.Fatalf("resent update %d follows %d", u.Seq, last)
		}
		last = u.Seq
		var params map[string]any
		if err := json.Unmarshal(u.JSON, &params); err != nil {
			h.t.Fatalf("resent update json %q: %v", u.JSON, err)
		}
		us = append(us, update{Seq: u.Seq, Type: bus.UpdateTypeName(u.Type), Params: params})
	}
	if resp.GetLost() == "" && last != resp.GetUptoSeq() {
		h.t.Fatalf("resent updates end at %d, not %d", last, resp.GetUptoSeq())
	}
	return resp, us
}

// liveTurn prompts id on h with text and returns the updates the turn
// published, its turn_complete last.
func liveTurn(h *harness, rec *recorder, id, text string) []update {
	h.t.Helper()
	if resp := h.prompt(alice, id, text); resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		h.t.Fatalf("prompt %q: %v", text, resp)
	}
	return rec.until(UpdateTurnComplete)
}

// sameTurn fails unless resent is live as a gateway's client sees it: its
// message text whole, its tool calls, results and turn_complete the same,
// in the same order, ending at the live turn's end.
func sameTurn(t *testing.T, live, resent []update) {
	t.Helper()
	shape := func(us []update) (string, []string) {
		var kinds, text []string
		for _, u := range us {
			switch u.Type {
			case UpdateMessageChunk:
				if len(kinds) == 0 || kinds[len(kinds)-1] != "text" {
					kinds = append(kinds, "text")
					text = append(text, "")
				}
				text[len(text)-1] += u.str("text")
			case UpdateToolCall, UpdateToolResult:
				in, _ := json.Marshal(u.Params["raw_input"])
				kinds = append(kinds, fmt.Sprintf("%s %s %s %s %v %s", u.Type, u.str("tool_call_id"), u.str("name"), in, u.Params["output_bytes"], u.str("raw_output")))
			case UpdateTurnComplete:
				kinds = append(kinds, fmt.Sprintf("%s %s %s %q", u.Type, u.str("turn_id"), u.str("outcome"), u.str("content")))
			case UpdateApprovalRequest, UpdateHistoryTrimmed:
				kinds = append(kinds, fmt.Sprintf("%d %s %v", u.Seq, u.Type, u.Params))
			default:
				kinds = append(kinds, u.Type)
			}
		}
		return strings.Join(kinds, " | "), text
	}
	lk, lt := shape(live)
	rk, rt := shape(resent)
	if lk != rk || fmt.Sprint(lt) != fmt.Sprint(rt) {
		t.Fatalf("resent turn\n%s %q\nwant the live one\n%s %q", rk, rt, lk, lt)
	}
	if resent[len(resent)-1].Seq != live[len(live)-1].Seq {
		t.Fatalf("resent turn ends at %d, the live one at %d", resent[len(resent)-1].Seq, live[len(live)-1].Seq)
	}
}

// Whole turns missed are rebuilt as they streamed (text, a tool call and
// its result, the turn_complete), each ending at its live end; a lone
// missed turn_complete is sent alone, with its number.
func TestResendRebuildsWholeTurnsAndALoneTurnComplete(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	first := liveTurn(h, rec, id, "/say one")
	second := liveTurn(h, rec, id, "/think hm\n/say two three")
	third := liveTurn(h, rec, id, "/say before\n"+`/tool echo {"text":"hi"}`+"\n/say after")
	end1, end2, end3 := first[len(first)-1].Seq, second[len(second)-1].Seq, third[len(third)-1].Seq

	resp, us := h.resend(id, end1, 0)
	if resp.GetLost() != "" || resp.GetUptoSeq() != end3 {
		t.Fatalf("resend after turn 1: lost %q, upto %d, want %d", resp.GetLost(), resp.GetUptoSeq(), end3)
	}
	split := 0
	for split < len(us) && us[split].Seq <= end2 {
		split++
	}
	sameTurn(t, second, us[:split])
	sameTurn(t, third, us[split:])

	resp, us = h.resend(id, 0, end1)
	if resp.GetLost() != "" {
		t.Fatalf("resend of the first turn: %q", resp.GetLost())
	}
	sameTurn(t, first, us)

	resp, us = h.resend(id, end3-1, end3)
	if resp.GetLost() != "" || len(us) != 1 || us[0].Seq != end3 {
		t.Fatalf("resend of a lone turn_complete: lost %q, %v", resp.GetLost(), us)
	}
	sameTurn(t, third[len(third)-1:], us)

	// Nothing missed: nothing sent, nothing lost.
	if resp, us = h.resend(id, end3, 0); resp.GetLost() != "" || len(us) != 0 || resp.GetUptoSeq() != end3 {
		t.Fatalf("resend past the last update: lost %q, %d updates, upto %d", resp.GetLost(), len(us), resp.GetUptoSeq())
	}
}

// A turn cut by a crash, of which the gateway had the first chunk: the
// rest of the text it had checkpointed is sent again, with its number,
// then its recovery's turn_complete, with the number recovery gave it
// and the text the turn had stored.
func TestResendSendsACrashCutTurnsRecoveredEnd(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: "/say first half\n/sleep 60000\n/say second half"})
	first := rec.next()
	eventually(t, func() error {
		if got := h.checkpointed(id); got != "first half" {
			return fmt.Errorf("checkpoint holds %q", got)
		}
		return nil
	})
	h.crash()
	var end update
	for end.Type != UpdateTurnComplete {
		end = rec.next()
	}
	resp, us := h.resend(id, first.Seq, 0)
	if resp.GetLost() != "" || len(us) != 2 || us[0].Type != UpdateMessageChunk || us[0].Seq != first.Seq+1 ||
		first.str("text")+us[0].str("text") != "first half" || us[1].Seq != end.Seq || us[1].Type != UpdateTurnComplete ||
		us[1].str("outcome") != OutcomeCancelled || us[1].str("content") != "first half" || us[1].str("stop_reason") != stopInterrupted {
		t.Fatalf("resend of a recovered turn's rest: lost %q, %v; recovery published %v", resp.GetLost(), us, end)
	}
}

// Past 8 turns, or past 8 MiB of params, Resend says the updates are
// lost (the gateway closes the followers, which read the transcript);
// at 8 turns, and under 8 MiB, it sends them.
func TestResendBounds(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	var ends []int64
	for i := range maxResendTurns + 2 {
		us := liveTurn(h, rec, id, fmt.Sprintf("/say n%d", i))
		ends = append(ends, us[len(us)-1].Seq)
	}
	if resp, _ := h.resend(id, ends[0], 0); !strings.Contains(resp.GetLost(), fmt.Sprintf("more than %d turns", maxResendTurns)) {
		t.Fatalf("resend of %d turns: lost %q", maxResendTurns+1, resp.GetLost())
	}
	resp, us := h.resend(id, ends[1], 0)
	if n := 0; resp.GetLost() == "" {
		for _, u := range us {
			if u.Type == UpdateTurnComplete {
				n++
			}
		}
		if n != maxResendTurns {
			t.Fatalf("resend of %d turns sent %d", maxResendTurns, n)
		}
	} else {
		t.Fatalf("resend of %d turns: lost %q", maxResendTurns, resp.GetLost())
	}

	// Three turns of 1.5 MiB of text each (3 MiB with their
	// turn_complete's content): two fit, three do not.
	word := strings.Repeat("w", 1023) + " "
	big := "/say " + strings.Repeat(word, 3<<9)
	from := ends[len(ends)-1]
	for range 3 {
		if resp := h.promptWithin(alice, id, big, testwait.Bound); resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
			t.Fatalf("prompt of 1.5 MiB: %v", resp)
		}
		ends = append(ends, h.lastTurnEnd(id))
	}
	if resp, _ := h.resend(id, from, 0); !strings.Contains(resp.GetLost(), fmt.Sprintf("pass %d bytes", maxResendBytes)) {
		t.Fatalf("resend of 9 MiB: lost %q", resp.GetLost())
	}
	resp, us = h.resend(id, ends[len(ends)-3], 0)
	if text := strings.Join(texts(us, UpdateMessageChunk), ""); resp.GetLost() != "" || resp.GetUptoSeq() != ends[len(ends)-1] ||
		text != strings.Repeat(word, 2*3<<9) {
		t.Fatalf("resend of 6 MiB: lost %q, upto %d, %d bytes of text", resp.GetLost(), resp.GetUptoSeq(), len(text))
	}
}

// lastTurnEnd is the number the session's latest turn's end took.
func (h *harness) lastTurnEnd(id string) int64 {
	h.t.Helper()
	var end int64
	if err := h.pool.QueryRow(context.Background(), `SELECT end_seq FROM turns WHERE session_id = $1 AND end_seq IS NOT NULL
		ORDER BY end_seq DESC LIMIT 1`, id).Scan(&end); err != nil {
		h.t.Fatalf("read the last turn's end: %v", err)
	}
	return end
}

// Every id is checked: a malformed session id, or a range that is none,
// is refused; an unknown session, or another incarnation of it, is lost.
func TestResendRefusesBadRequests(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	for _, req := range []*sessionv1.ResendRequest{
		{SessionId: "../" + id},
		{SessionId: ""},
		{SessionId: strings.Repeat("s", 4096)},
		{SessionId: id, AfterSeq: -1},
		{SessionId: id, AfterSeq: 5, UptoSeq: 5},
		{SessionId: id, AfterSeq: 6, UptoSeq: 5},
	} {
		_, err := h.srv.Resend(context.Background(), req)
		wantRefusal(t, err, codes.InvalidArgument, rpcerr.ReasonInvalid, "")
	}
	for _, req := range []*sessionv1.ResendRequest{
		{SessionId: "s_unknown0000000000000000", Incarnation: 1},
		{SessionId: id, Incarnation: h.incarnation(id) + 1},
	} {
		resp, err := h.srv.Resend(context.Background(), req)
		if err != nil || resp.GetLost() != "the session is gone" || len(resp.GetUpdates()) != 0 {
			t.Fatalf("resend of %v: %v, %v", req, resp, err)
		}
	}
}

// A resent tool_result says the whole output's size, as the live one did,
// though it carries the 16 KiB the session kept. Before, it said the
// kept part's size.
func TestResentToolResultSaysTheWholeOutputsSize(t *testing.T) {
	sb := floodSandbox{limits: make(chan int32, 1)}
	h := newHarness(t, func(c *Config) { c.Plugins = pluginClient(t, serveSandbox(t, sb)) })
	id := h.newSession(alice, "default")
	rec := h.record(id)
	live := liveTurn(h, rec, id, "/tool flood\n/say end")
	_, us := h.resend(id, 0, 0)
	var got, want []any
	for _, u := range live {
		if u.Type == UpdateToolResult {
			want = append(want, u.Params["output_bytes"])
		}
	}
	for _, u := range us {
		if u.Type == UpdateToolResult {
			got = append(got, u.Params["output_bytes"])
			if n := len(u.str("raw_output")); n > MaxToolOutputBytes+256 {
				t.Fatalf("resent raw_output of %d bytes, more than kept", n)
			}
		}
	}
	if len(want) != 1 || want[0] != float64(2<<20) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("resent tool_result's output_bytes %v, the live one's %v", got, want)
	}
}

// Turns that ended before migration 0014 have no end number. A turn after
// a numbered one is rebuilt whole however many unnumbered turns came
// before that one (before, any unnumbered turn earlier in the session
// made every later turn a loss, said as a hole "mid-turn"); the turn
// right after an unnumbered one is refused, saying why (where its updates
// begin is not known), but its lone turn_complete is still sent.
func TestResendAfterTurnsWithoutAnEndNumber(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	var turns [][]update
	for _, text := range []string{"/say old", "/say first numbered", "/say second numbered"} {
		turns = append(turns, liveTurn(h, rec, id, text))
	}
	end := func(i int) int64 { return turns[i][len(turns[i])-1].Seq }
	// As a database upgraded from before migration 0014 holds it.
	if _, err := h.pool.Exec(context.Background(), "UPDATE turns SET end_seq = NULL WHERE turn_id = $1", turns[0][0].str("turn_id")); err != nil {
		t.Fatal(err)
	}

	resp, us := h.resend(id, end(1), 0)
	if resp.GetLost() != "" {
		t.Fatalf("resend of a turn after a numbered one, an unnumbered one before: lost %q", resp.GetLost())
	}
	sameTurn(t, turns[2], us)

	resp, _ = h.resend(id, end(0), 0)
	if want := "which ended before its end's update number was stored (migration 0014)"; !strings.Contains(resp.GetLost(), want) ||
		!strings.Contains(resp.GetLost(), turns[0][0].str("turn_id")) || len(resp.GetUpdates()) != 0 {
		t.Fatalf("resend of the turn after an unnumbered one: lost %q, want it to say %q", resp.GetLost(), want)
	}

	resp, us = h.resend(id, end(1)-1, end(1))
	if resp.GetLost() != "" {
		t.Fatalf("resend of a lone turn_complete after an unnumbered turn: lost %q", resp.GetLost())
	}
	sameTurn(t, turns[1][len(turns[1])-1:], us)
}

// A gateway that missed the middle of a turn, wherever the hole starts
// (before a chunk, between two chunks of one checkpointed text, before a
// tool call or its result), is sent the updates numbered past what it
// had, with their numbers: the text it missed and no more, the tool
// call and result it missed, the turn_complete. Before, every such hole
// was a loss ("missed mid-turn: their numbers are not stored").
func TestResendFillsAHoleMidTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	first := liveTurn(h, rec, id, "/say zero")
	turn := liveTurn(h, rec, id, "/say one two\n/sleep 200\n/say three four\n"+`/tool echo {"text":"hi"}`+"\n/say five six")
	prev, end := first[len(first)-1].Seq, turn[len(turn)-1].Seq
	for after := prev + 1; after < end; after++ {
		var missed []update
		for _, u := range turn {
			if u.Seq > after {
				missed = append(missed, u)
			}
		}
		resp, us := h.resend(id, after, 0)
		if resp.GetLost() != "" || resp.GetUptoSeq() != end {
			t.Fatalf("resend after %d, mid-turn: lost %q, upto %d", after, resp.GetLost(), resp.GetUptoSeq())
		}
		sameTurn(t, missed, us)
		for _, u := range us {
			if u.Type == UpdateToolCall || u.Type == UpdateToolResult {
				for _, l := range turn {
					if l.Type == u.Type && l.Seq != u.Seq {
						t.Fatalf("resent %s numbered %d, published as %d", u.Type, u.Seq, l.Seq)
					}
				}
			}
		}
	}
}

// A gateway that missed updates of a turn still running (its bus link
// back before the turn's end) is sent them, wherever the hole starts,
// with the numbers they were published with: the text it missed and no
// more, the tool call and result it missed, up to the last update
// published (or the number it asks up to). Before, every such hole was a
// loss ("no ended turn holds the updates ... a turn still running").
func TestResendFillsAHoleInARunningTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	first := liveTurn(h, rec, id, "/say zero")
	prev := first[len(first)-1].Seq
	ctx, cancel := context.WithCancel(context.Background())
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: "/say one two\n/sleep 200\n/say three four\n" + `/tool echo {"text":"hi"}` + "\n/say five six\n/sleep 60000\n/say seven"})
	var live []update
	for text := ""; !strings.HasSuffix(text, "five six"); {
		u := rec.next()
		live = append(live, u)
		if u.Type == UpdateMessageChunk {
			text += u.str("text")
		}
	}
	last := live[len(live)-1].Seq
	missedAfter := func(after, upto int64) []update {
		var missed []update
		for _, u := range live {
			if u.Seq > after && u.Seq <= upto {
				missed = append(missed, u)
			}
		}
		return missed
	}
	for after := prev; after < last; after++ {
		resp, us := h.resend(id, after, 0)
		if resp.GetLost() != "" || resp.GetUptoSeq() != last {
			t.Fatalf("resend after %d, in the running turn: lost %q, upto %d, want %d", after, resp.GetLost(), resp.GetUptoSeq(), last)
		}
		sameTurn(t, missedAfter(after, last), us)
		for _, u := range us {
			for _, l := range live {
				if (u.Type == UpdateToolCall || u.Type == UpdateToolResult) && l.Type == u.Type && l.Seq != u.Seq {
					t.Fatalf("resent %s numbered %d, published as %d", u.Type, u.Seq, l.Seq)
				}
			}
		}
	}
	// Up to a number the gateway names, within the turn.
	for upto := prev + 1; upto <= last; upto++ {
		resp, us := h.resend(id, prev, upto)
		if resp.GetLost() != "" || resp.GetUptoSeq() != upto {
			t.Fatalf("resend after %d up to %d, in the running turn: lost %q, upto %d", prev, upto, resp.GetLost(), resp.GetUptoSeq())
		}
		sameTurn(t, missedAfter(prev, upto), us)
	}
	cancel()
	if r := testwait.Recv(t, res); r.resp.GetOutcome() != outcomeEnum[OutcomeCancelled] && r.err == nil {
		t.Fatalf("the turn, its caller gone: %v", r.resp)
	}
}

// A turn cut by a crash, of which the gateway had part: the updates past
// what it had that the turn had checkpointed (its text, its tool call
// and result) are sent again with the numbers they were published with,
// then its recovery's turn_complete. Before, the recovery's end alone:
// the text and the tool updates the gateway missed were never sent.
func TestResendFillsTheMiddleOfACrashCutTurn(t *testing.T) {
	h := newHarness(t)
	id := h.newSession(alice, "default")
	rec := h.record(id)
	first := liveTurn(h, rec, id, "/say zero")
	prev := first[len(first)-1].Seq
	h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: "/say one two\n/sleep 200\n/say three four\n" + `/tool echo {"text":"hi"}` + "\n/say five six\n/sleep 60000\n/say seven"})
	var live []update
	for text := ""; !strings.HasSuffix(text, "five six"); {
		u := rec.next()
		live = append(live, u)
		if u.Type == UpdateMessageChunk {
			text += u.str("text")
		}
	}
	eventually(t, func() error {
		if got := h.checkpointed(id); !strings.HasSuffix(got, "five six") {
			return fmt.Errorf("checkpoint holds %q", got)
		}
		return nil
	})
	h.crash()
	var end update
	for end.Type != UpdateTurnComplete {
		end = rec.next()
	}
	for after := prev + 1; after <= live[len(live)-1].Seq; after++ {
		want := []update{}
		for _, u := range live {
			if u.Seq > after {
				want = append(want, u)
			}
		}
		resp, us := h.resend(id, after, 0)
		if resp.GetLost() != "" || resp.GetUptoSeq() != end.Seq {
			t.Fatalf("resend after %d, in a crash-cut turn: lost %q, upto %d, want %d", after, resp.GetLost(), resp.GetUptoSeq(), end.Seq)
		}
		sameTurn(t, append(want, end), us)
	}
}

// Approval requests and history_trimmed notices a gateway missed are
// sent again with the rest, as they were published (their numbers and
// params): an ask still open while its turn waits for the decision, and
// both in a turn ended since, missed whole or from its middle. Before,
// the open ask's turn was a loss, and an ended turn was sent without
// them: a silent hole (a client never asked, a trim never told).
func TestResendSendsApprovalRequestsAndTrimNotices(t *testing.T) {
	h := newHarness(t)
	// See TestTrimRetainedContext: the third turn's context (two turns
	// of 27 estimated tokens, its prompt) passes 60, and the first goes.
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "tinyguarded", Provider: ProviderScripted, ContextBudgetTokens: 60,
		ApprovalRequired: []string{"echo"}, ApprovalTimeout: 30 * time.Second}})
	id := h.newSession(alice, "tinyguarded")
	rec := h.record(id)
	const say = "/say aaaa bbbb cccc dddd eeee ffff gggg"
	liveTurn(h, rec, id, say)
	second := liveTurn(h, rec, id, say)
	prev := second[len(second)-1].Seq
	res := h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: "/say one\n" + `/tool echo {"text":"hi"}` + "\n/say after"})
	live := rec.until(UpdateApprovalRequest)
	if live[0].Type != UpdateHistoryTrimmed {
		t.Fatalf("the third turn began with %s", types(live))
	}
	ask := live[len(live)-1]
	for after := prev; after < ask.Seq; after++ {
		resp, us := h.resend(id, after, 0)
		if resp.GetLost() != "" || len(us) == 0 || fmt.Sprint(us[len(us)-1]) != fmt.Sprint(ask) {
			t.Fatalf("resend after %d, the ask open: lost %q, %v; published %v", after, resp.GetLost(), us, ask)
		}
	}
	if _, err := h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: ask.str("request_id"),
		Decision: decisionOf(DecisionAllowOnce), Surface: surfaceOf(SurfaceRPC)}); err != nil {
		t.Fatal(err)
	}
	live = append(live, rec.until(UpdateTurnComplete)...)
	if r := testwait.Recv(t, res); r.err != nil || r.resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("prompt: %v %v", r.resp, r.err)
	}
	for after := prev; after < live[len(live)-1].Seq; after++ {
		var missed []update
		for _, u := range live {
			if u.Seq > after {
				missed = append(missed, settledAs(u, DecisionAllowOnce, SurfaceRPC))
			}
		}
		resp, us := h.resend(id, after, 0)
		if resp.GetLost() != "" {
			t.Fatalf("resend after %d, the turn ended: lost %q", after, resp.GetLost())
		}
		sameTurn(t, missed, us)
	}
}

// settledAs is u as Resend sends it again once decided: an
// approval_request says its decision and who gave it.
func settledAs(u update, decision, by string) update {
	if u.Type != UpdateApprovalRequest {
		return u
	}
	p := map[string]any{"decision": decision, "decided_by": by}
	for k, v := range u.Params {
		p[k] = v
	}
	u.Params = p
	return u
}

// An approval request sent again after its decision says that decision
// and who gave it (decision, decided_by), whichever decided it: a person
// (session/approve) while the turn still runs, the timeout, the turn's
// cancellation. Before, it was sent as published, undecided: the gateway
// put it to its clients again (elicitation/create) for an approval
// nobody could change any more (the tool had run, or been denied).
func TestResentApprovalRequestSaysItsDecision(t *testing.T) {
	h := newHarness(t)
	for alias, timeout := range map[string]time.Duration{"guarded": 30 * time.Second, "hasty": time.Second} {
		h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: alias, Provider: ProviderScripted,
			ApprovalRequired: []string{"echo"}, ApprovalTimeout: timeout}})
	}
	resentAsk := func(id string, after int64) update {
		t.Helper()
		resp, us := h.resend(id, after, 0)
		if resp.GetLost() != "" {
			t.Fatalf("resend after %d: lost %q", after, resp.GetLost())
		}
		for _, u := range us {
			if u.Type == UpdateApprovalRequest {
				return u
			}
		}
		t.Fatalf("resend after %d: no approval_request in %s", after, types(us))
		return update{}
	}
	settled := func(what string, u update, decision, by string) {
		t.Helper()
		if u.str("decision") != decision || u.str("decided_by") != by {
			t.Fatalf("%s: the approval_request sent again says decision %v by %v, want %q by %q (%v)",
				what, u.Params["decision"], u.Params["decided_by"], decision, by, u.Params)
		}
	}

	// Decided with session/approve; the turn still runs.
	id, rec, prev := sessionAfterATurn(h, "guarded")
	ctx, cancel := context.WithCancel(context.Background())
	res := h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id,
		Prompt: "/say one\n" + `/tool echo {"text":"hi"}` + "\n/say after\n/sleep 60000"})
	live := rec.until(UpdateApprovalRequest)
	ask := live[len(live)-1]
	if u := resentAsk(id, prev); u.Params["decision"] != nil || fmt.Sprint(u) != fmt.Sprint(ask) {
		t.Fatalf("the ask still open, sent again as %v; published %v", u, ask)
	}
	if _, err := h.srv.Approve(context.Background(), &sessionv1.ApproveRequest{Principal: alice, SessionId: id, RequestId: ask.str("request_id"),
		Decision: decisionOf(DecisionAllowOnce), Surface: surfaceOf(SurfaceRPC)}); err != nil {
		t.Fatal(err)
	}
	rec.until(UpdateToolResult)
	settled("approved, the turn running", resentAsk(id, prev), DecisionAllowOnce, SurfaceRPC)
	settled("approved, the turn running, from the ask's turn's middle", resentAsk(id, ask.Seq-1), DecisionAllowOnce, SurfaceRPC)
	// Cancelled with its turn while it waits.
	cancel()
	testwait.Recv(t, res)
	rec.until(UpdateTurnComplete)
	id2, rec2, prev2 := sessionAfterATurn(h, "guarded")
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	res = h.promptAsync(ctx, &sessionv1.PromptRequest{Principal: alice, SessionId: id2, Prompt: `/tool echo {"text":"hi"}`})
	rec2.until(UpdateApprovalRequest)
	cancel()
	testwait.Recv(t, res)
	rec2.until(UpdateTurnComplete)
	settled("its turn cancelled", resentAsk(id2, prev2), decisionCancelled, surfaceService)

	// Denied by its timeout; the turn ended.
	id3, rec3, prev3 := sessionAfterATurn(h, "hasty")
	liveTurn(h, rec3, id3, `/tool echo {"text":"hi"}`)
	settled("timed out", resentAsk(id3, prev3), decisionTimeout, surfaceService)
}

// hangingSandbox is a plugin sandbox whose one tool, hang, runs until
// its call is cancelled.
type hangingSandbox struct {
	pluginv1.UnimplementedPluginServiceServer
}

func (hangingSandbox) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	return &pluginv1.ListToolsResponse{Tools: []*pluginv1.Tool{{Name: "hang", ParametersSchemaJson: `{"type":"object"}`, PluginKey: "p"}}}, nil
}

func (hangingSandbox) ExecuteTool(ctx context.Context, _ *pluginv1.ExecuteToolRequest) (*pluginv1.ExecuteToolResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A crash of the session service while a tool runs, or while an
// approval waits, keeps the place of the updates published since the
// turn's last batch of events (the tool_call, the approval_request):
// after the restart, a gateway that missed them gets them again with
// their numbers, then the recovery's turn_complete, from every hole.
// Before, their marks waited in memory for the turn's next event, which
// never came: Resend answered the turn lost ("a crash cut the turn
// before it stored where its last updates are"). The writer's next batch
// (flush, which its timer would run within 100 ms) stands for the wait
// before the crash.
func TestResendFillsACrashCutTurnWhileAToolRunsOrAnApprovalWaits(t *testing.T) {
	client := pluginClient(t, serveSandbox(t, hangingSandbox{}))
	h := newHarness(t, func(c *Config) { c.Plugins = client })
	guardEcho(h)
	cases := []struct {
		name, alias, prompt, until string
	}{
		{"a tool running", "default", "/say one two\n/tool hang {}\n/say after", UpdateToolCall},
		{"an approval waiting", "guarded", "/say one two\n" + `/tool echo {"text":"hi"}` + "\n/say after", UpdateApprovalRequest},
	}
	for _, c := range cases {
		id := h.newSession(alice, c.alias)
		rec := h.record(id)
		first := liveTurn(h, rec, id, "/say zero")
		prev := first[len(first)-1].Seq
		h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: c.prompt})
		live := rec.until(c.until)
		end := crashMidTurn(h, rec, id)
		for after := prev; after < end.Seq; after++ {
			want := []update{}
			for _, u := range live {
				if u.Seq > after {
					want = append(want, settledAs(u, decisionCancelled, surfaceService))
				}
			}
			resp, us := h.resend(id, after, 0)
			if resp.GetLost() != "" || resp.GetUptoSeq() != end.Seq {
				t.Fatalf("%s: resend after %d, the turn cut by a crash: lost %q, upto %d, want %d", c.name, after, resp.GetLost(), resp.GetUptoSeq(), end.Seq)
			}
			sameTurn(t, append(want, end), us)
		}
	}
}

// mapped waits until the running turn of session id has mapped every
// update it published (publishMapped maps one under mapMu after its
// publish, which a recorder may see first).
func (h *harness) mapped(id string) {
	h.t.Helper()
	ls := h.srv.lookupLive(id)
	if ls == nil {
		h.t.Fatalf("session %s is not live", id)
	}
	ls.mu.Lock()
	t := ls.turn
	ls.mu.Unlock()
	if t == nil {
		h.t.Fatalf("session %s runs no turn", id)
	}
	t.mapMu.Lock()
	defer t.mapMu.Unlock()
}

// guardEcho sets the agent "guarded", whose echo calls wait up to an
// hour for an approval.
func guardEcho(h *harness) {
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "guarded", Provider: ProviderScripted,
		ApprovalRequired: []string{"echo"}, ApprovalTimeout: time.Hour}})
}

// sessionAfterATurn opens a session of alice's with alias, records its
// updates and runs one turn in it; prev is that turn's last update's
// number.
func sessionAfterATurn(h *harness, alias string) (id string, rec *recorder, prev int64) {
	id = h.newSession(alice, alias)
	rec = h.record(id)
	first := liveTurn(h, rec, id, "/say zero")
	return id, rec, first[len(first)-1].Seq
}

// crashMidTurn crashes the service while session id's turn runs, once its
// checkpoints are written and the session is mapped, and returns the
// turn_complete the recovery publishes for the cut turn.
func crashMidTurn(h *harness, rec *recorder, id string) update {
	h.mapped(id)
	h.srv.cp.flush()
	h.crash()
	var end update
	for end.Type != UpdateTurnComplete {
		end = rec.next()
	}
	return end
}
