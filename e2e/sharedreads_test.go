package e2e_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// The gateway answers concurrent identical status and session/state reads
// of one principal with one call to the session service. Here that sharing
// is pressed from two principals at once, on the session being closed:
// each principal keeps its own answers (alice is never shown the
// operator's session, the operator always is), and a read made after a
// close has returned always sees it closed, however many reads of the same
// session were in flight when it arrived.
func TestSharedReadsStayPerPrincipalAndFresh(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := newConv(t, s, nil)
	token := aliceChats(t, s, op)
	dial := func(auth bool) *e2e.Client {
		c := s.Dial(t)
		params := map[string]any{"protocol_version": 1}
		if auth {
			params["auth_token"] = token
		}
		if _, err := c.Call("initialize", params); err != nil {
			t.Fatal(err)
		}
		return c
	}
	probe := newConv(t, s, nil)

	for round := range 8 {
		sid := op.newSession("")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		// hammer pipelines windows of session/state and status on sid
		// until stop, checking every answer with check.
		hammer := func(c *e2e.Client, check func(method string, f *e2e.Frame) error) {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				methods := map[string]string{}
				for i := range 16 {
					id := fmt.Sprintf("%d-%d", n, i)
					m, params := "session/state", `{"session_id":"`+sid+`"}`
					if i%4 == 3 {
						m, params = "status", `{}`
					}
					methods[`"`+id+`"`] = m
					if err := c.Send(`{"jsonrpc":"2.0","id":"` + id + `","method":"` + m + `","params":` + params + `}`); err != nil {
						t.Error(err)
						return
					}
				}
				for len(methods) > 0 {
					f, line, err := c.Read(30 * time.Second)
					if err != nil {
						t.Errorf("read: %v (%q)", err, line)
						return
					}
					m, ok := methods[string(f.ID)]
					if !ok {
						continue
					}
					delete(methods, string(f.ID))
					if err := check(m, f); err != nil {
						t.Errorf("round %d: %s: %v", round, m, err)
						return
					}
				}
			}
		}
		opCheck := func(m string, f *e2e.Frame) error {
			if f.Error != nil {
				return fmt.Errorf("operator refused: %+v", f.Error)
			}
			if m == "session/state" {
				var r struct{ SessionID, State string }
				if err := json.Unmarshal(f.Result, &r); err != nil {
					return err
				}
				if r.State != "idle" && r.State != "closed" {
					return fmt.Errorf("state %q", r.State)
				}
			}
			return nil
		}
		aliceCheck := func(m string, f *e2e.Frame) error {
			if m == "session/state" {
				if f.Error == nil || f.Error.Code != -32003 {
					return fmt.Errorf("alice read the operator's session: %s %+v", f.Result, f.Error)
				}
				return nil
			}
			if f.Error != nil {
				return fmt.Errorf("alice's status refused: %+v", f.Error)
			}
			var st struct {
				SessionIDs []string `json:"session_ids"`
			}
			if err := json.Unmarshal(f.Result, &st); err != nil {
				return err
			}
			if slices.Contains(st.SessionIDs, sid) {
				return fmt.Errorf("alice's status lists the operator's session")
			}
			return nil
		}
		for range 3 {
			wg.Add(2)
			go hammer(dial(false), opCheck)
			go hammer(dial(true), aliceCheck)
		}
		time.Sleep(20 * time.Millisecond)
		op.call("session/close", map[string]any{"session_id": sid})
		var st struct{ State string }
		if err := json.Unmarshal(probe.call("session/state", map[string]any{"session_id": sid}), &st); err != nil {
			t.Fatal(err)
		}
		var status struct {
			SessionIDs []string `json:"session_ids"`
		}
		if err := json.Unmarshal(probe.call("status", nil), &status); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		if st.State != "closed" {
			t.Fatalf("round %d: session/state after close returned: %q", round, st.State)
		}
		if slices.Contains(status.SessionIDs, sid) {
			t.Fatalf("round %d: status after close still lists %s", round, sid)
		}
	}
}

// A deleted session's id is free, and may next name another principal's
// session: the deletion detaches every connection that followed it, so
// the operator sees nothing of the session alice then opens under the
// same id.
func TestDeletionDetachesBeforeTheIDIsReused(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := newConv(t, s, nil)
	token := aliceChats(t, s, op)
	id := op.newSession("")
	op.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say mine"})
	op.call("session/delete", map[string]any{"session_id": id})

	alice := &conv{t: t, c: s.Dial(t), n: 100}
	if _, err := alice.c.Call("initialize", map[string]any{"protocol_version": 1, "auth_token": token}); err != nil {
		t.Fatal(err)
	}
	alice.call("session/new", map[string]any{"session_id": id})
	ups, _ := alice.until(alice.send("session/prompt", map[string]any{"session_id": id, "prompt": "/say alice's secret"}))
	if countType(ups, "turn_complete") != 1 {
		t.Fatalf("alice's turn: %+v", ups)
	}
	// Whatever the operator's connection still had coming has arrived by
	// the answer to a call made after alice's turn ended.
	seen, _ := op.until(op.send("status", nil))
	for _, u := range seen {
		if u.SessionIDc == id {
			t.Fatalf("the operator saw alice's session under the reused id: %+v", u)
		}
	}
}
