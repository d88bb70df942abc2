package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// A page of the transcript ends before the message that takes its content
// past pageBytes of JSON and holds at least one message however large;
// paged on, every message is read once, in order, from either end.
func TestTranscriptPagesBoundedByBytes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	const m = pageBytes / 4
	// As JSON, its quotes included: m, 3m, m, m, 5m, 2, 2.
	sizes := []int{m - 2, 3*m - 2, m - 2, m - 2, 5*m - 2, 0, 0}
	for i, n := range sizes {
		content := strings.Repeat("x", n)
		if _, err := h.pool.Exec(ctx, "INSERT INTO messages (session_id, idx, role, content, json_size) VALUES ($1, $2, 'user', $3, $4)",
			id, i, content, jsonSize(content)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.pool.Exec(ctx, "UPDATE sessions SET message_count = $2 WHERE session_id = $1", id, len(sizes)); err != nil {
		t.Fatal(err)
	}

	// session/messages, from the newest end back.
	back, contents := pagesBack(t, h, id, len(sizes))
	for i, c := range contents {
		if len(c) != sizes[i] {
			t.Fatalf("message %d has %d bytes", i, len(c))
		}
	}
	if got := strings.Join(back, " "); got != "[5 6] [4] [2 3] [0 1]" {
		t.Fatalf("pages from the end: %s", got)
	}

	// Transcript (the durable bridge's), from the first message on.
	var fwd []string
	after := int64(-1)
	for range sizes {
		resp, err := h.srv.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, AfterIndex: &after, Limit: MaxTranscriptLimit})
		if err != nil {
			t.Fatal(err)
		}
		var idx []int64
		for _, msg := range resp.GetMessages() {
			idx = append(idx, msg.GetIndex())
		}
		fwd = append(fwd, fmt.Sprint(idx))
		if len(idx) == 0 || idx[len(idx)-1]+1 >= resp.GetTotal() {
			break
		}
		after = idx[len(idx)-1]
	}
	if got := strings.Join(fwd, " "); got != "[0 1] [2 3] [4] [5 6]" {
		t.Fatalf("pages from the start: %s", got)
	}
	// Its last page, from the end.
	resp, err := h.srv.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator, SessionId: id, Limit: MaxTranscriptLimit})
	if err != nil || len(resp.GetMessages()) != 2 || resp.GetMessages()[0].GetIndex() != 5 {
		t.Fatalf("the last page: %v %v", resp.GetMessages(), err)
	}

	// The row limit still holds.
	one, err := h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id, Limit: 1})
	if err != nil || len(one.GetMessages()) != 1 || one.GetMessages()[0].GetIndex() != 6 {
		t.Fatalf("a page of one: %v %v", one.GetMessages(), err)
	}
}

// A page is bounded by its messages as JSON: a '<' is six bytes there.
// Messages written before json_size was kept count six bytes a byte; and
// a message past what a frame carries is read cut, and says so.
func TestTranscriptPagesBoundedAsJSON(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	lt := strings.Repeat("<", pageBytes/6/2) // half a page as JSON
	if jsonSize(lt) != int32(len(lt))*6+2 {
		t.Fatalf("jsonSize of %d '<': %d", len(lt), jsonSize(lt))
	}
	rows := []struct {
		content string
		legacy  bool
	}{
		{strings.Repeat("w", 9<<20), true}, // past the frame as JSON
		{lt, false}, {lt, false}, {lt, false},
		{strings.Repeat("a", pageBytes/6/2), true}, {strings.Repeat("a", pageBytes/6/2), true},
	}
	for i, r := range rows {
		var size any
		if !r.legacy {
			size = jsonSize(r.content)
		}
		if _, err := h.pool.Exec(ctx, "INSERT INTO messages (session_id, idx, role, content, json_size) VALUES ($1, $2, 'user', $3, $4)",
			id, i, r.content, size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.pool.Exec(ctx, "UPDATE sessions SET message_count = $2 WHERE session_id = $1", id, len(rows)); err != nil {
		t.Fatal(err)
	}
	back, contents := pagesBack(t, h, id, len(rows))
	first := contents[0]
	if got := strings.Join(back, " "); got != "[4 5] [2 3] [1] [0]" {
		t.Fatalf("pages from the end: %s", got)
	}
	if int(jsonSize(first)) > maxReadMessage || !strings.HasSuffix(first, fmt.Sprintf(" of its %d bytes shown]", 9<<20)) {
		t.Fatalf("the message past the frame read back as %d bytes of JSON, ending %q", jsonSize(first), first[len(first)-60:])
	}
}

// A cwd is kept in the session's row: one past PATH_MAX is refused
// before anything is made, where it was stored whatever its size (up to
// the 8 MiB frame, in every session an attacker made).
func TestNewSessionRefusesCwdPastPathMax(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	_, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "default", SessionId: "sess_longcwd", Cwd: "/" + strings.Repeat("d", maxCwdBytes)})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "`cwd` is 4097 bytes; the limit is 4096" {
		t.Fatalf("a cwd of 4097 bytes: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(h.dataDir, "workspaces", "sess_longcwd")); !os.IsNotExist(serr) {
		t.Fatalf("a workspace made for a refused session: %v", serr)
	}
	resp, err := h.srv.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: alice, AgentAlias: "default", Cwd: strings.Repeat("d", maxCwdBytes)})
	if err != nil || resp.GetSessionId() == "" {
		t.Fatalf("a cwd of 4096 bytes: %v", err)
	}
}

// BenchmarkMessagesPage reads a page of 1,000 messages (of 200 bytes)
// from a session of 100,000: the last, and one in the middle.
func BenchmarkMessagesPage(b *testing.B) {
	h := newHarness(b)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	const n = 100_000
	content := strings.Repeat("m", 200)
	if _, err := h.pool.Exec(ctx, `INSERT INTO messages (session_id, idx, role, content, json_size)
		SELECT $1, i, 'user', $2, $3 FROM generate_series(0, $4 - 1) i`, id, content, jsonSize(content), n); err != nil {
		b.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, "UPDATE sessions SET message_count = $2 WHERE session_id = $1", id, n); err != nil {
		b.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, "ANALYZE messages"); err != nil {
		b.Fatal(err)
	}
	for _, at := range []struct {
		name   string
		before *int64
	}{{"last", nil}, {"middle", ptrTo(int64(n / 2))}} {
		b.Run(at.name, func(b *testing.B) {
			req := &sessionv1.MessagesRequest{Principal: alice, SessionId: id, Limit: MaxPageLimit, BeforeIndex: at.before}
			for b.Loop() {
				resp, err := h.srv.Messages(ctx, req)
				if err != nil || len(resp.GetMessages()) != MaxPageLimit {
					b.Fatalf("%d messages: %v", len(resp.GetMessages()), err)
				}
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// pagesBack reads session id's n messages with Messages from the newest
// end back, and returns each page's indexes and every message's content
// by index.
func pagesBack(t *testing.T, h *harness, id string, n int) (pages []string, contents map[int64]string) {
	t.Helper()
	contents = map[int64]string{}
	req := &sessionv1.MessagesRequest{Principal: alice, SessionId: id, Limit: MaxPageLimit}
	for range n {
		resp, err := h.srv.Messages(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		var idx []int64
		for _, msg := range resp.GetMessages() {
			idx = append(idx, msg.GetIndex())
			contents[msg.GetIndex()] = msg.GetContent()
		}
		pages = append(pages, fmt.Sprint(idx))
		if len(idx) == 0 || idx[0] == 0 {
			break
		}
		req.BeforeIndex = &idx[0]
	}
	if len(contents) != n {
		t.Fatalf("%d of %d messages read", len(contents), n)
	}
	return pages, contents
}

// A page and the total beside it are read at one moment: a message
// written while the page was read is in both or in neither. Read apart,
// the total came from before the message and the page from after it, so
// the newest page held an index at the total or past it (18 pages of 400
// read while another connection prompted).
func TestPageAndTotalReadTogether(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	for i := range 3 {
		if err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
			_, err := appendMessageTx(ctx, tx, id, "", roleUser, fmt.Sprintf("m%d", i))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, read := range []struct {
		name string
		last func() (int64, int64, error) // the page's last index, and the total
	}{
		{"session/messages", func() (int64, int64, error) {
			resp, err := h.srv.Messages(ctx, &sessionv1.MessagesRequest{Principal: alice, SessionId: id})
			if err != nil || len(resp.GetMessages()) == 0 {
				return 0, 0, fmt.Errorf("%v %w", resp, err)
			}
			return resp.GetMessages()[len(resp.GetMessages())-1].GetIndex(), resp.GetTotal(), nil
		}},
		{"Transcript", func() (int64, int64, error) {
			resp, err := h.srv.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator, SessionId: id})
			if err != nil || len(resp.GetMessages()) == 0 {
				return 0, 0, fmt.Errorf("%v %w", resp, err)
			}
			return resp.GetMessages()[len(resp.GetMessages())-1].GetIndex(), resp.GetTotal(), nil
		}},
	} {
		// A transaction holding the messages table makes the read wait
		// on it; a message is written in it and committed while the read
		// waits.
		tx, err := h.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE messages IN ACCESS EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		type page struct {
			last, total int64
			err         error
		}
		got := make(chan page, 1)
		go func() {
			last, total, err := read.last()
			got <- page{last, total, err}
		}()
		testenv.Eventually(t, wait, 5*time.Millisecond, func() error {
			var n int
			if err := h.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
				WHERE relation = 'messages'::regclass AND NOT granted`).Scan(&n); err != nil || n == 0 {
				return fmt.Errorf("the read does not wait for the table yet (%v)", err)
			}
			return nil
		})
		if _, err := appendMessageTx(ctx, tx, id, "", roleUser, "written while the page was read"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		p := testwait.Recv(t, got)
		if p.err != nil {
			t.Fatalf("%s: %v", read.name, p.err)
		}
		if p.last != p.total-1 {
			t.Fatalf("%s: the newest page ends at index %d, the total is %d", read.name, p.last, p.total)
		}
	}
}

// A row written before the bounds (the largest were 50 MB and more) was
// read whole wherever the transcript is read, a page's messages, the
// durable bridge's transcript and the history of a session without a
// snapshot, to be cut at once to maxReadMessage: 64 MiB crossed from
// PostgreSQL and was held twice. It is read bounded in SQL, its start and
// its size: what a read allocates is counted (runtime.MemStats, not
// timed), and what it gives is what cutting the whole gave, the note
// with the row's whole size included.
func TestOldOversizedRowsAreReadBounded(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	id := h.newSession(alice, "default")
	// Two bytes a character, so the bounded start ends within one.
	const rowBytes = 64 << 20
	whole := strings.Repeat("é", rowBytes/2)
	for i, role := range []string{"user", "assistant"} {
		if _, err := h.pool.Exec(ctx, "INSERT INTO messages (session_id, idx, role, content) VALUES ($1, $2, $3, $4)",
			id, i, role, whole); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.pool.Exec(ctx, "UPDATE sessions SET message_count = 2 WHERE session_id = $1", id); err != nil {
		t.Fatal(err)
	}
	want := cutForRead(whole)
	if !strings.HasSuffix(want, fmt.Sprintf(" of its %d bytes shown]", rowBytes)) {
		t.Fatalf("the whole row cut ends %q", want[len(want)-60:])
	}
	allocated := func(read func() ([]string, error)) ([]string, uint64) {
		t.Helper()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		got, err := read()
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		return got, after.TotalAlloc - before.TotalAlloc
	}
	reads := []struct {
		name string
		read func() ([]string, error)
	}{
		{"messages", func() ([]string, error) {
			msgs, _, err := h.srv.store.messages(ctx, id, 1, -1)
			var out []string
			for _, m := range msgs {
				out = append(out, m.Content)
			}
			return out, err
		}},
		{"transcript", func() ([]string, error) {
			msgs, _, err := h.srv.store.transcript(ctx, id, 0, 1)
			var out []string
			for _, m := range msgs {
				out = append(out, m.GetContent())
			}
			return out, err
		}},
		{"history", func() ([]string, error) {
			msgs, err := h.srv.store.legacyHistory(ctx, id, 1)
			var out []string
			for _, m := range msgs {
				out = append(out, m.Content)
			}
			return out, err
		}},
	}
	for _, r := range reads {
		got, built := allocated(r.read)
		t.Logf("%s: reading a %d-byte row allocated %d bytes", r.name, rowBytes, built)
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: read %d messages (%d bytes), want the row cut as the whole one was", r.name, len(got), len(strings.Join(got, "")))
		}
		if built >= rowBytes {
			t.Errorf("%s: reading a %d-byte row allocated %d bytes, want less than the row", r.name, rowBytes, built)
		}
	}
}
