package session

import (
	"context"
	"testing"

	"github.com/clawmesh/clawmesh/internal/configclient"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A crash of the session service while the provider's next step is
// awaited after a tool's result, or while a turn's first step is awaited
// after its history_trimmed notice, keeps the place of that update: it
// was published after its event (or the prompt's) was written, so no
// pending event carried its mark, which the checkpoint writer's next
// batch stores alone (takeLoneMarks). After the restart a gateway that
// missed it, from every hole, gets it again with its number, then the
// recovery's turn_complete. The writer's batch (flush) stands for its
// timer's, within 100 ms of the publish. Without the lone mark stored
// the turn was answered lost ("a crash cut the turn before it stored
// where its last updates are").
func TestResendFillsACrashCutTurnAfterAToolResultOrATrimNotice(t *testing.T) {
	h := newHarness(t)
	// See TestResendSendsApprovalRequestsAndTrimNotices: the third turn
	// of "tiny" trims the first.
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "tiny", Provider: ProviderScripted, ContextBudgetTokens: 60}})
	const say = "/say aaaa bbbb cccc dddd eeee ffff gggg"
	cases := []struct {
		name, alias string
		before      []string
		prompt      string
		until       string
	}{
		{"a tool's result, the next step awaited", "default", []string{"/say zero"},
			"/say one two\n" + `/tool echo {"text":"hi"}` + "\n/sleep 60000\n/say after", UpdateToolResult},
		{"a trim notice, the first step awaited", "tiny", []string{say, say},
			"/sleep 60000\n/say after", UpdateHistoryTrimmed},
	}
	for _, c := range cases {
		id := h.newSession(alice, c.alias)
		rec := h.record(id)
		var prev int64
		for _, p := range c.before {
			done := liveTurn(h, rec, id, p)
			prev = done[len(done)-1].Seq
		}
		h.promptAsync(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: id, Prompt: c.prompt})
		live := rec.until(c.until)
		end := crashMidTurn(h, rec, id)
		for after := prev; after < end.Seq; after++ {
			var want []update
			for _, u := range live {
				if u.Seq > after {
					want = append(want, u)
				}
			}
			resp, us := h.resend(id, after, 0)
			if resp.GetLost() != "" || resp.GetUptoSeq() != end.Seq {
				t.Fatalf("%s: resend after %d, the turn cut by a crash: lost %q, upto %d, want %d", c.name, after, resp.GetLost(), resp.GetUptoSeq(), end.Seq)
			}
			sameTurn(t, append(want, end), us)
			// sameTurn compares a tool_result without its number.
			if u := live[len(live)-1]; u.Seq > after {
				if last := us[len(us)-2]; last.Type != u.Type || last.Seq != u.Seq {
					t.Fatalf("%s: resend after %d sent %s %d before the turn's end, want %s %d", c.name, after, last.Type, last.Seq, u.Type, u.Seq)
				}
			}
		}
	}
}
