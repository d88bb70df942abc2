package session

import (
	"context"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// heldOnPrivatePostgres is a harness on a PostgreSQL cluster of the
// test's own (to stop and start), a session of alice's, a recorder of its
// updates and its live entry, held until release.
func heldOnPrivatePostgres(t *testing.T) (*testenv.PGServer, *harness, string, *recorder, *liveSession, func()) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster of its own")
	}
	server := testenv.PrivatePostgres(t)
	h := newHarnessOn(t, server.URL(), func(c *Config) { c.UnwindTimeout = 2 * time.Second })
	id := h.newSession(alice, "default")
	rec := h.record(id)
	row, err := h.srv.store.session(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ls, release := h.srv.hold(context.Background(), row)
	return server, h, id, rec, ls, release
}

// spendBlock publishes chunks of turn on ls until its reserved numbers
// are all used, and returns the updates rec saw of them.
func spendBlock(t *testing.T, h *harness, ls *liveSession, rec *recorder, turn string) map[int64]string {
	t.Helper()
	for {
		ls.pubMu.Lock()
		// The bound itself is kept unused (reserveSeqLocked).
		spent := ls.seqReserved > 0 && ls.seq+1 >= ls.seqReserved
		ls.pubMu.Unlock()
		if spent {
			break
		}
		h.srv.publishChunk(ls, UpdateMessageChunk, turn, "x")
	}
	seen := map[int64]string{}
	for len(seen) < int(seqBlock)-1 {
		u := rec.next()
		seen[u.Seq] = u.str("turn_id")
	}
	return seen
}

// An update whose number cannot be reserved (the database is down when
// the block is spent) is not published: numbering past the stored bound
// gave its number, after a crash, to another update too, and a
// subscriber that skips what it has seen by seq (the durable bridge)
// dropped that one. The process that lost updates dies before it stores
// anything; the next one starts from the stored bound and gives no
// number twice.
func TestSeqNotReusedAfterAFailedReservationAndACrash(t *testing.T) {
	server, h, id, rec, ls, release := heldOnPrivatePostgres(t)
	seen := spendBlock(t, h, ls, rec, "t-old")

	server.Stop()
	for range 3 {
		h.srv.publishChunk(ls, UpdateMessageChunk, "t-old", "published while the database was down")
	}
	release()
	ls.pubMu.Lock()
	last := ls.seq
	ls.pubMu.Unlock()
	for len(seen) < int(last) {
		u := rec.next()
		seen[u.Seq] = u.str("turn_id")
	}

	server.Start()
	h.crash()
	h.prompt(alice, id, "/say after the crash")
	for _, u := range rec.until(UpdateTurnComplete) {
		if old, dup := seen[u.Seq]; dup {
			t.Errorf("seq %d given twice: to an update of turn %s and to a %s of turn %s", u.Seq, old, u.Type, u.str("turn_id"))
		}
	}
}

// Updates lost for want of a reservation leave a gap in seq once one is
// stored again, so that subscribers (the gateway closes the connections
// following the session) see that some are missing.
func TestUpdatesLostForWantOfAReservationLeaveAGap(t *testing.T) {
	server, h, id, rec, ls, release := heldOnPrivatePostgres(t)
	defer release()
	spendBlock(t, h, ls, rec, "t-1")

	server.Stop()
	h.srv.publishChunk(ls, UpdateMessageChunk, "t-1", "lost")
	h.srv.publishChunk(ls, UpdateMessageChunk, "t-1", "lost too")
	server.Start()
	h.srv.publishChunk(ls, UpdateMessageChunk, "t-1", "after the database came back")
	u := rec.next()
	if u.str("text") != "after the database came back" {
		t.Fatalf("published while the database was down: %q, seq %d", u.str("text"), u.Seq)
	}
	if u.Seq != seqBlock+1 {
		t.Fatalf("the update after the lost ones numbered %d, want %d: one number skipped", u.Seq, seqBlock+1)
	}
	if got := h.storedSeq(id); got < u.Seq {
		t.Fatalf("seq %d published past the stored bound %d", u.Seq, got)
	}
}

// Updates lost for want of a reservation, then a crash before any
// reservation lands: the next process's first update leaves a gap after
// the last one published, so that subscribers see that some are
// missing. Before, the block's last number had been published and the
// next process numbered on from it: the lost updates left no trace, and
// a follower took a turn cut short for whole.
func TestUpdatesLostBeforeACrashLeaveAGap(t *testing.T) {
	server, h, id, rec, ls, release := heldOnPrivatePostgres(t)
	seen := spendBlock(t, h, ls, rec, "t-old")
	var last int64
	for seq := range seen {
		last = max(last, seq)
	}

	server.Stop()
	h.srv.publishChunk(ls, UpdateMessageChunk, "t-old", "lost")
	release()
	server.Start()
	h.crash()
	h.prompt(alice, id, "/say after the crash")
	ups := rec.until(UpdateTurnComplete)
	if len(ups) == 0 {
		t.Fatal("no update after the crash")
	}
	if first := ups[0].Seq; first <= last+1 {
		t.Errorf("first update after the lost one and a crash numbered %d, the last published %d: no gap", first, last)
	}
}
