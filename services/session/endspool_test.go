package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// bigWords is a reply of n words of about 4.8 KB each, of characters JSON
// escapes (a '<' or a '&' is six bytes in JSON, a '"' or a '\' two) and
// of two-byte ones: what a file of JSON strings holds most inflated.
func bigWords(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:", i)
		b.WriteString(strings.Repeat("w<é\"\\&x", 600))
	}
	return b.String()
}

// A spooled end held its text three times over (the reply, the text the
// transcript lacks, the events), JSON-escaped: a reply of 1.2 MB of such
// text was a file of 9 MB, synced before its turn_complete went out. It holds the text once now, and the start stores it byte for byte
// as its clients were sent it.
func TestALargeSpooledEndHoldsItsTextOnce(t *testing.T) {
	h := newEndFailingHarness(t, noBatches, func(c *Config) { c.CheckpointBytes = 64 << 20 })
	id := h.newSession(operator, "default")
	reply := bigWords(250)
	prompt := "/say " + reply + "\n/sleep 1500\n/say last"
	reply += "\nlast"

	rec := h.record(id)
	done := h.failEnd(UpdateMessageChunk, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: prompt}, false)
	sent := strings.Join(texts(rec.until(UpdateTurnComplete), UpdateMessageChunk), "")
	if sent != reply || done.Params["content"] != reply {
		t.Fatalf("the case: %d bytes sent in chunks, turn_complete's content %d bytes, want the reply's %d", len(sent), len(done.str("content")), len(reply))
	}
	turnID := done.str("turn_id")
	st, err := os.Stat(filepath.Join(h.spoolDir(), turnID+spoolExt))
	if err != nil {
		t.Fatal(err)
	}
	// The events carried are the reply's chunks (the prompt's event is
	// stored at the turn's start): the reply is their text.
	t.Logf("the spooled end: %d bytes, %.3f times the reply's %d", st.Size(), float64(st.Size())/float64(len(reply)), len(reply))
	if float64(st.Size()) > 1.2*float64(len(reply)) {
		t.Errorf("the spooled end is %d bytes, %.2f times the reply's %d, which its events carry", st.Size(), float64(st.Size())/float64(len(reply)), len(reply))
	}

	h.crash()
	h.endedAsTold(id, turnID, OutcomeCompleted, stopEndTurn, sent)
	var user string
	if err := h.pool.QueryRow(context.Background(), "SELECT content FROM checkpoint_events WHERE turn_id = $1 AND kind = 'user'", turnID).Scan(&user); err != nil || user != prompt {
		t.Errorf("the turn's prompt event: %d bytes %v, want the prompt's %d", len(user), err, len(prompt))
	}
}

// A file of the spool's first version, which the build before wrote for
// a turn its clients were told had ended, is written as it ended: refused,
// the turn was recorded as recovery records one and a second
// turn_complete told its clients otherwise.
func TestASpooledEndOfTheFirstVersionIsWritten(t *testing.T) {
	h := newEndFailingHarness(t, noBatches)
	id := h.newSession(operator, "default")
	turnID := h.completedUnrecorded(id)
	e, err := h.srv.spool.load(turnID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.spoolDir(), turnID+spoolExt), encodeSpooledV1(t, e), 0o600); err != nil {
		t.Fatal(err)
	}

	h.crashThenEndedAsTold(id, turnID)
	if left := h.spooled(); len(left) != 0 {
		t.Fatalf("the spool holds %v once the start wrote it", left)
	}
}

// Files set aside as refused stayed for ever, each start logging each of
// them again. A start removes those refused more than maxRefusedAge ago
// and, past maxRefusedFiles, the oldest, each with a log saying so; the
// rest it keeps without a log of each.
func TestRefusedSpoolFilesAreBounded(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	put := func(name string, age time.Duration) {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("not a turn end"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	put("turn_old_a.end"+refusedExt, maxRefusedAge+time.Hour)
	put("turn_old_b.end"+refusedExt, 30*24*time.Hour)
	for i := range maxRefusedFiles + 2 {
		name := fmt.Sprintf("turn_recent_%02d.end%s", i, refusedExt)
		put(name, time.Duration(i+1)*time.Minute)
		if i < maxRefusedFiles-1 {
			want = append(want, name)
		}
	}
	// Refused by this start: the newest, so kept; refused an hour after
	// the file was written, its age is counted from its refusal.
	put("turn_new.end", maxRefusedAge+time.Hour)
	want = append(want, "turn_new.end"+refusedExt)
	slices.Sort(want)

	core, logs := observer.New(zap.InfoLevel)
	open := func() {
		t.Helper()
		if _, _, err := openEndSpool(dir, zap.New(core)); err != nil {
			t.Fatal(err)
		}
	}
	open()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, de := range des {
		got = append(got, de.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the spool holds %v, want %v", got, want)
	}
	removed := map[string]string{}
	for _, l := range logs.FilterMessage("turn end spool: a refused file removed").All() {
		f := l.ContextMap()
		removed[filepath.Base(f["path"].(string))], _ = f["why"].(string)
	}
	if len(removed) != 5 || !strings.Contains(removed["turn_old_a.end"+refusedExt], "days") ||
		!strings.Contains(removed[fmt.Sprintf("turn_recent_%02d.end%s", maxRefusedFiles+1, refusedExt)], "kept") {
		t.Fatalf("the removals logged: %v", removed)
	}

	// A second start removes nothing and logs each file kept no more.
	logs.TakeAll()
	open()
	if n := logs.Len(); n > 1 {
		t.Fatalf("a second start logged %d lines about the refused files: %v", n, logs.All())
	}
	if n := logs.FilterMessage("turn end spool: a refused file removed").Len(); n != 0 {
		t.Fatalf("a second start removed %d files", n)
	}
}

// Between the failed write and the session's next admission or eviction
// the turn's row reads running, and TurnEvents (a pane's build: the
// durable bridge's) answered from it: the turn not ended, without its
// reply, the events the failed write carried missing. The service holds
// the end: it answers from it, the turn ended as its clients were told.
func TestTurnEventsOfAnEndNotWrittenSayItEnded(t *testing.T) {
	for _, memory := range []bool{true, false} {
		t.Run(fmt.Sprintf("in_memory_%v", memory), func(t *testing.T) {
			h := newEndFailingHarness(t, noBatches, keptAnHour)
			id := h.newSession(operator, "default")
			if !memory {
				h.srv.unendedBytes.Store(maxUnendedBytes)
			}
			turnID := h.completedUnrecorded(id)
			if n := h.count("SELECT count(*) FROM turns WHERE turn_id = $1 AND state = 'running'", turnID); n != 1 {
				t.Fatal("the case: the turn's row does not read running")
			}
			resp, err := h.srv.TurnEvents(context.Background(), &sessionv1.TurnEventsRequest{Principal: operator, SessionId: id, TurnIds: []string{turnID}})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetTurns()) != 1 {
				t.Fatalf("TurnEvents gives %d turns, want the turn, ended", len(resp.GetTurns()))
			}
			tr := resp.GetTurns()[0]
			var text []string
			var kinds []string
			for _, e := range tr.GetEvents() {
				kinds = append(kinds, e.GetKind())
				if e.GetKind() == eventText {
					text = append(text, e.GetText())
				}
			}
			if !tr.GetEnded() || tr.GetContent() != "first\nlast" || strings.Join(text, "") != "first\nlast" {
				t.Fatalf("TurnEvents says ended %v, content %q, text events %q (%v); its clients were told it completed, \"first\\nlast\"",
					tr.GetEnded(), tr.GetContent(), text, kinds)
			}
			st, err := h.srv.State(context.Background(), &sessionv1.StateRequest{Principal: operator, SessionId: id})
			if err != nil || st.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || st.GetTurnId() != "" {
				t.Fatalf("session/state: %v %v, want idle", st, err)
			}
		})
	}
}

// encodeSpooledV1 is e's file as the spool's first version wrote it.
func encodeSpooledV1(t *testing.T, e *turnEnd) []byte {
	t.Helper()
	body, err := json.Marshal(spooledEndV1{
		SessionID: e.sessionID, TurnID: e.turnID, Outcome: e.res.Outcome, StopReason: e.res.StopReason,
		Content: e.res.Content, Error: e.res.Error, Said: e.res.Said, Unshown: e.said, Published: e.published,
		Unrecorded: e.unrecorded, UpdateMap: e.updateMap, Events: e.events,
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	head, err := json.Marshal(spoolHeader{Format: spoolFormat, Version: 1, SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	return append(append(head, '\n'), body...)
}

// A gateway that missed updates of a turn whose end is held but not
// written (the turn's row reads running until the session's next
// admission or eviction) was told lost, Resend reading only the turns the
// store reads ended, and closed the session's followers. The service
// holds the end, its events and its update map: Resend sends the turn's
// updates from them, with their numbers, as it will once the end is
// written, wherever the hole starts.
func TestResendOfAHeldEndSendsItsUpdates(t *testing.T) {
	tool := "/think hm\n/say before\n" + `/tool echo {"text":"hi"}` + "\n/sleep 1500\n/say after"
	for _, c := range []struct {
		name, prompt string
		memory       bool
	}{{"text_in_memory", "", true}, {"text_spooled", "", false}, {"tool_in_memory", tool, true}, {"tool_spooled", tool, false}, {"cancelled", "cut", true}} {
		memory := c.memory
		t.Run(c.name, func(t *testing.T) {
			h := newEndFailingHarness(t, noBatches, keptAnHour)
			id := h.newSession(operator, "default")
			if !memory {
				h.srv.unendedBytes.Store(maxUnendedBytes)
			}
			rec := h.record(id)
			if r := h.prompt(operator, id, "/say zero"); r.GetContent() != "zero" {
				t.Fatalf("the first prompt: %v", r)
			}
			first := rec.until(UpdateTurnComplete)
			var turnID string
			switch c.prompt {
			case "":
				turnID = h.completedUnrecorded(id)
			case "cut":
				turnID = h.cutUnrecorded(id)
			default:
				done := h.failEnd(UpdateToolResult, &sessionv1.PromptRequest{Principal: operator, SessionId: id, Prompt: c.prompt}, false)
				turnID, _ = done.Params["turn_id"].(string)
			}
			live := rec.until(UpdateTurnComplete)
			if n := h.count("SELECT count(*) FROM turns WHERE turn_id = $1 AND state = 'running'", turnID); n != 1 {
				t.Fatal("the case: the turn's row does not read running")
			}
			prev, end := first[len(first)-1].Seq, live[len(live)-1].Seq
			for after := prev; after < end; after++ {
				var missed []update
				for _, u := range live {
					if u.Seq > after {
						missed = append(missed, u)
					}
				}
				resp, us := h.resend(id, after, 0)
				if resp.GetLost() != "" || resp.GetUptoSeq() != end {
					t.Fatalf("resend after %d of the held turn %s: lost %q, upto %d, want %d", after, turnID, resp.GetLost(), resp.GetUptoSeq(), end)
				}
				sameTurn(t, missed, us)
				if after > prev && us[0].Seq != missed[0].Seq && missed[0].Type != UpdateMessageChunk {
					t.Fatalf("resent %s numbered %d, published as %d", us[0].Type, us[0].Seq, missed[0].Seq)
				}
			}
			// Written at the next admission: the same answer from the store.
			_, before := h.resend(id, prev, end)
			h.promptNext(id)
			if _, after := h.resend(id, prev, end); fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("resent while held\n%v\nonce written\n%v", before, after)
			}
		})
	}
}
