package uploadstaging

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
)

// clock is a settable time.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// defaults are docs/spec.md §6's limits, as the schema's defaults give them.
func defaults() configclient.Uploads { return configclient.Snapshot{}.Uploads() }

func newStage(t *testing.T, tweak func(*configclient.Uploads)) (*Stage, *clock) {
	t.Helper()
	lim := defaults()
	if tweak != nil {
		tweak(&lim)
	}
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	return NewStage(func() configclient.Uploads { return lim }, 15*time.Second, c.Now, nil), c
}

var (
	connA = Owner{Gateway: "gw-1", Conn: "conn-a", Principal: "shared-operator"}
	connB = Owner{Gateway: "gw-1", Conn: "conn-b", Principal: "shared-operator"}
)

func decl(o Owner, size int64) Declared {
	return Declared{Owner: o, SessionID: "sess_1", Size: size, Generation: 1, Incarnation: 7, SessionOwner: o.Principal, Agent: "default"}
}

func reserve(t *testing.T, st *Stage, d Declared) string {
	t.Helper()
	id, err := st.Reserve(d)
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	return id
}

// refused checks a refusal: -32602 (InvalidArgument) and the exact text.
func refused(t *testing.T, err error, reason, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if err == nil || !ok {
		t.Fatalf("want %q, got %v", msg, err)
	}
	got, _ := rpcerr.Details(st)
	if st.Code() != codes.InvalidArgument || got != reason || st.Message() != msg {
		t.Fatalf("want InvalidArgument %s %q, got %v %s %q", reason, msg, st.Code(), got, st.Message())
	}
}

// Every refusal of docs/spec.md §6 that the stage gives, word for word.
func TestStageRefusals(t *testing.T) {
	st, _ := newStage(t, nil)
	hex64 := strings.Repeat("ab", 32)

	for _, tc := range []struct {
		name     string
		size     int64
		filename string
		sha      string
		msg      string
	}{
		{"file limit", 10485761, "", "", "Upload of 10485761 bytes exceeds the 10 MB file limit"},
		{"filename", 0, strings.Repeat("f", 256), "", "`filename` is 256 bytes; the limit is 255"},
		{"sha256 short", 1, "", hex64[:63], "`sha256` must be 64 hexadecimal characters"},
		{"sha256 not hex", 1, "", strings.Repeat("zz", 32), "`sha256` must be 64 hexadecimal characters"},
		{"negative size", -1, "", "", "`size_bytes` must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.CheckDeclared(tc.size, tc.filename, tc.sha)
			refused(t, err, rpcerr.ReasonInvalid, tc.msg)
		})
	}
	// Accepted: exactly the limits; sha256 trimmed and lower-cased.
	if sum, err := st.CheckDeclared(10485760, strings.Repeat("f", 255), " "+strings.ToUpper(hex64)+" "); err != nil || sum != hex64 {
		t.Fatalf("at the limits: %q %v", sum, err)
	}

	id := reserve(t, st, decl(connA, 10))
	if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		t.Fatalf("upload id %q", id)
	}
	chunk := func(off int64, data string) error {
		_, err := st.Chunk(connA, id, off, []byte(data))
		return err
	}
	refused(t, chunk(0, ""), rpcerr.ReasonInvalid, "A chunk must carry between 1 and 1048576 decoded bytes")
	refused(t, chunk(0, strings.Repeat("x", 1048577)), rpcerr.ReasonInvalid, "A chunk must carry between 1 and 1048576 decoded bytes")
	refused(t, chunk(3, "abc"), rpcerr.ReasonInvalid, "Chunk at offset 3 leaves a gap; the next offset is 0")
	if err := chunk(0, "abcd"); err != nil {
		t.Fatal(err)
	}
	refused(t, chunk(2, "zz"), rpcerr.ReasonInvalid, "Chunk at offset 2 overlaps received data; the next offset is 4")
	refused(t, chunk(2, "cdef"), rpcerr.ReasonInvalid, "Chunk at offset 2 overlaps received data; the next offset is 4")
	refused(t, chunk(4, "1234567"), rpcerr.ReasonInvalid, "Chunk ends at byte 11, past the declared size of 10")
	_, err := st.Take(connA, id)
	refused(t, err, rpcerr.ReasonInvalid, "Upload has 4 of 10 declared bytes; send the rest before committing")
	// Still staged after that refusal.
	if err := chunk(4, "efghij"); err != nil {
		t.Fatal(err)
	}
	if p, err := st.Take(connA, id); err != nil || string(p.Data) != "abcdefghij" {
		t.Fatalf("take %q %v", p.Data, err)
	}
	st.Finish(id, false, true)
	refused(t, chunk(0, "a"), rpcerr.ReasonNotFound, "Unknown or expired upload `"+id+"`")

	// A declared hash is not checked by Take, which hashes nothing: the
	// session service compares it with its own sum (Commit hands it on)
	// and a mismatch's refusal ends in Finish, which discards the upload.
	d := decl(connA, 3)
	d.SHA256 = uploads.Sum([]byte("abd"))
	id = reserve(t, st, d)
	if _, err := st.Chunk(connA, id, 0, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	hashed := uploads.HashedBytes()
	p, err := st.Take(connA, id)
	if err != nil || p.Decl.SHA256 != d.SHA256 || string(p.Data) != "abc" {
		t.Fatalf("take %+v %v", p, err)
	}
	if n := uploads.HashedBytes() - hashed; n != 0 {
		t.Fatalf("Take hashed %d bytes", n)
	}
	st.Finish(id, false, true)
	_, err = st.Take(connA, id)
	refused(t, err, rpcerr.ReasonNotFound, "Unknown or expired upload `"+id+"`")
	if s := st.Stats(); s.Uploads != 0 || s.Charged != 0 || s.Payload != 0 {
		t.Fatalf("left staged: %+v", s)
	}
}

// Lost reply: the same chunk again gets the same received_bytes and
// changes nothing; other bytes at that offset are an overlap.
func TestStageIdenticalResendIsAcknowledged(t *testing.T) {
	st, _ := newStage(t, nil)
	id := reserve(t, st, decl(connA, 6))
	for range 2 {
		if got, err := st.Chunk(connA, id, 0, []byte("abc")); err != nil || got != 3 {
			t.Fatalf("chunk: %d %v", got, err)
		}
	}
	if got, err := st.Chunk(connA, id, 3, []byte("def")); err != nil || got != 6 {
		t.Fatalf("second chunk: %d %v", got, err)
	}
	// Resends of accepted chunks, after more arrived, still acknowledge.
	for _, c := range []struct {
		off  int64
		data string
	}{{0, "abc"}, {3, "def"}} {
		if got, err := st.Chunk(connA, id, c.off, []byte(c.data)); err != nil || got != 6 {
			t.Fatalf("resend at %d: %d %v", c.off, got, err)
		}
	}
	_, err := st.Chunk(connA, id, 0, []byte("abX"))
	refused(t, err, rpcerr.ReasonInvalid, "Chunk at offset 0 overlaps received data; the next offset is 6")
	if p, err := st.Take(connA, id); err != nil || string(p.Data) != "abcdef" {
		t.Fatalf("content %q %v", p.Data, err)
	}
}

// An upload is its connection's: another connection (or the same one
// bound to another principal, or another gateway's connection with the
// same id) is told it does not exist; closing the connection frees it.
func TestStageUploadBelongsToItsConnection(t *testing.T) {
	st, _ := newStage(t, nil)
	id := reserve(t, st, decl(connA, 4))
	unknownMsg := "Unknown or expired upload `" + id + "`"
	for _, other := range []Owner{
		connB,
		{Gateway: connA.Gateway, Conn: connA.Conn, Principal: "user:mallory"},
		{Gateway: "gw-2", Conn: connA.Conn, Principal: connA.Principal},
	} {
		_, err := st.Chunk(other, id, 0, []byte("abcd"))
		refused(t, err, rpcerr.ReasonNotFound, unknownMsg)
		_, err = st.Take(other, id)
		refused(t, err, rpcerr.ReasonNotFound, unknownMsg)
	}
	if n := st.DiscardConnection(connB.Gateway, connB.Conn); n != 0 {
		t.Fatalf("another connection's close discarded %d", n)
	}
	if _, err := st.Chunk(connA, id, 0, []byte("ab")); err != nil {
		t.Fatal(err)
	}
	if n := st.DiscardConnection(connA.Gateway, connA.Conn); n != 1 {
		t.Fatalf("discarded %d", n)
	}
	_, err := st.Chunk(connA, id, 2, []byte("cd"))
	refused(t, err, rpcerr.ReasonNotFound, unknownMsg)
	if s := st.Stats(); s.Uploads != 0 || s.Charged != 0 || s.Payload != 0 || s.Gateways != 0 {
		t.Fatalf("after close: %+v", s)
	}
}

// Four uploads per connection; idle ones expire and make room.
func TestStagePerConnectionLimit(t *testing.T) {
	st, clk := newStage(t, nil)
	for range 4 {
		reserve(t, st, decl(connA, 1))
	}
	msg := "This connection already has 4 uploads in progress; commit them or let them expire before beginning another"
	refused(t, st.CheckRoom(decl(connA, 1)), rpcerr.ReasonCapacity, msg)
	_, err := st.Reserve(decl(connA, 1))
	refused(t, err, rpcerr.ReasonCapacity, msg)
	if err := st.CheckRoom(decl(connB, 1)); err != nil {
		t.Fatalf("another connection: %v", err)
	}
	clk.advance(5 * time.Minute)
	if err := st.CheckRoom(decl(connA, 1)); err != nil {
		t.Fatalf("after the idle timeout: %v", err)
	}
	reserve(t, st, decl(connA, 1))
}

// The budget covers payload and metadata. A begin that does not fit is
// refused; once uploads are idle past the timeout (of a connection still
// open, and not the one beginning), they are reclaimed for it.
func TestStageBudgetAndIdleReclaim(t *testing.T) {
	const budget = 4 << 20
	st, clk := newStage(t, func(u *configclient.Uploads) { u.MaxStagedBytes = budget })
	var ids []string
	conns := []Owner{}
	for i := range 3 {
		o := Owner{Gateway: "gw-1", Conn: fmt.Sprintf("conn-%d", i), Principal: "shared-operator"}
		conns = append(conns, o)
		ids = append(ids, reserve(t, st, decl(o, 1<<20)))
	}
	// 3 MiB plus metadata staged: a fourth MiB does not fit.
	late := Owner{Gateway: "gw-1", Conn: "conn-late", Principal: "shared-operator"}
	_, err := st.Reserve(decl(late, 1<<20))
	refused(t, err, rpcerr.ReasonCapacity, "The daemon is staging too many uploads to accept this one now; retry after in-progress uploads finish")
	if s := st.Stats(); s.Charged <= 3<<20 || s.Charged > budget {
		t.Fatalf("charged %d", s.Charged)
	}

	// conn-0 stays active; the others go idle.
	clk.advance(4 * time.Minute)
	if _, err := st.Chunk(conns[0], ids[0], 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Minute)
	if _, err := st.Reserve(decl(late, 1<<20)); err != nil {
		t.Fatalf("after the others went idle: %v", err)
	}
	if s := st.Stats(); s.Uploads != 2 {
		t.Fatalf("uploads after reclaim: %+v", s)
	}
	if _, err := st.Chunk(conns[0], ids[0], 1, []byte("y")); err != nil {
		t.Fatalf("the active upload was reclaimed: %v", err)
	}
	_, err = st.Chunk(conns[1], ids[1], 0, []byte("x"))
	refused(t, err, rpcerr.ReasonNotFound, "Unknown or expired upload `"+ids[1]+"`")
}

// Metadata is charged: empty uploads with 255-byte filenames hit the
// budget too, and the charge is exactly payload + kept strings +
// UploadOverhead.
func TestStageMetadataIsCharged(t *testing.T) {
	const budget = 64 << 10
	st, _ := newStage(t, func(u *configclient.Uploads) { u.MaxStagedBytes = budget })
	name := strings.Repeat("n", 255)
	n := 0
	for ; ; n++ {
		o := Owner{Gateway: "gw-1", Conn: fmt.Sprintf("conn-%04d", n), Principal: "user:somebody"}
		d := decl(o, 0)
		d.Filename = name
		id, err := st.Reserve(d)
		if err != nil {
			refused(t, err, rpcerr.ReasonCapacity, uploads.OverBudget)
			break
		}
		want := int64(UploadOverhead + len(id) + len(o.Gateway) + len(o.Conn) + len(o.Principal) + len(d.SessionID) +
			len(name) + len(d.SessionOwner) + len(d.Agent))
		if got := st.Stats().Charged; got != want*int64(n+1) {
			t.Fatalf("charged %d after %d uploads of %d", got, n+1, want)
		}
		if n > 1000 {
			t.Fatal("empty uploads never hit the budget")
		}
	}
	if n < 50 || st.Stats().Charged > budget {
		t.Fatalf("%d empty uploads, %d charged", n, st.Stats().Charged)
	}
}

// UploadOverhead covers the upload record and its index entries.
func TestUploadOverheadCoversTheRecord(t *testing.T) {
	// Each index entry: a string key and a pointer, with a map's
	// per-slot control byte; three indexes (by id, by connection, the
	// gateway's lease count) and the lease record shared by a gateway's
	// uploads, counted whole for its first.
	entry := unsafe.Sizeof("") + unsafe.Sizeof(&upload{}) + 1
	need := unsafe.Sizeof(upload{}) + 3*entry + unsafe.Sizeof(gatewayLease{})
	if need > UploadOverhead {
		t.Fatalf("an upload record needs %d bytes, UploadOverhead is %d", need, UploadOverhead)
	}
}

// A gateway that stops renewing loses its uploads once the lease runs
// out; one that renews keeps them.
func TestStageGatewayLease(t *testing.T) {
	st, clk := newStage(t, nil)
	dead := Owner{Gateway: "gw-dead", Conn: "conn-1", Principal: "shared-operator"}
	alive := Owner{Gateway: "gw-alive", Conn: "conn-2", Principal: "shared-operator"}
	deadID := reserve(t, st, decl(dead, 1<<20))
	aliveID := reserve(t, st, decl(alive, 1<<20))
	for range 4 {
		clk.advance(5 * time.Second)
		st.Renew("gw-alive")
		st.Sweep()
	}
	if _, err := st.Chunk(dead, deadID, 0, []byte("x")); err == nil {
		t.Fatal("an upload outlived its gateway's lease")
	}
	if _, err := st.Chunk(alive, aliveID, 0, []byte("x")); err != nil {
		t.Fatalf("a renewed gateway lost its upload: %v", err)
	}
	if s := st.Stats(); s.Uploads != 1 || s.Gateways != 1 {
		t.Fatalf("after the lease: %+v", s)
	}
	// Renewing an unknown gateway holds nothing.
	st.Renew("gw-none")
	if s := st.Stats(); s.Gateways != 1 {
		t.Fatalf("a lease for a gateway without uploads: %+v", s)
	}
}

// A gateway whose transport closed is gone: a begin of the same user
// on the gateway started in its place, which its uploads' charge would
// refuse for the rest of their lease, reclaims them first. A gateway
// that called again over a new transport is not gone, and one whose
// transport is unknown keeps its lease.
func TestStageGatewayTransportClosed(t *testing.T) {
	st, _ := newStage(t, func(u *configclient.Uploads) { u.MaxUserStagedBytes = 2 << 20 })
	dead := Owner{Gateway: "gw-dead", Conn: "conn-1", Principal: "user:alice"}
	moved := Owner{Gateway: "gw-moved", Conn: "conn-2", Principal: "user:bob"}
	unknown := Owner{Gateway: "gw-unknown", Conn: "conn-3", Principal: "user:bob"}
	deadID := reserve(t, st, decl(dead, 3<<19))
	st.SeenOn(dead.Gateway, 1)
	movedID := reserve(t, st, decl(moved, 1<<10))
	st.SeenOn(moved.Gateway, 1)
	st.SeenOn(moved.Gateway, 2)
	unknownID := reserve(t, st, decl(unknown, 1<<10))
	fresh := Owner{Gateway: "gw-new", Conn: "conn-1", Principal: "user:alice"}
	if _, err := st.Reserve(decl(fresh, 3<<19)); err == nil {
		t.Fatal("the share was not full")
	}
	st.TransportClosed(1)
	reserve(t, st, decl(fresh, 3<<19))
	if _, err := st.Chunk(dead, deadID, 0, []byte("x")); err == nil {
		t.Fatal("the gone gateway's upload is still staged")
	}
	for _, u := range []struct {
		o  Owner
		id string
	}{{moved, movedID}, {unknown, unknownID}} {
		if _, err := st.Chunk(u.o, u.id, 0, []byte("x")); err != nil {
			t.Fatalf("%s lost its upload: %v", u.o.Gateway, err)
		}
	}
	// The sweep leaves a cut gateway's uploads to its lease: room not
	// wanted now is not worth them, should the gateway renew on a new
	// transport.
	st.SeenOn(moved.Gateway, 3)
	st.TransportClosed(3)
	if n := st.Sweep(); n != 0 {
		t.Fatalf("the sweep dropped %d uploads; want none", n)
	}
	st.SeenOn(moved.Gateway, 4)
	if _, err := st.Chunk(moved, movedID, 1, []byte("y")); err != nil {
		t.Fatalf("a gateway that called again over a new transport lost its upload: %v", err)
	}
}

// The sweeper drops idle uploads on its own.
func TestStageSweepExpiresIdle(t *testing.T) {
	st, clk := newStage(t, nil)
	id := reserve(t, st, decl(connA, 8))
	// The gateway renews its lease: only the idle timeout applies.
	clk.advance(4 * time.Minute)
	st.Renew(connA.Gateway)
	if n := st.Sweep(); n != 0 {
		t.Fatalf("swept %d before the timeout", n)
	}
	clk.advance(time.Minute)
	st.Renew(connA.Gateway)
	if n := st.Sweep(); n != 1 {
		t.Fatalf("swept %d", n)
	}
	_, err := st.Chunk(connA, id, 0, []byte("x"))
	refused(t, err, rpcerr.ReasonNotFound, "Unknown or expired upload `"+id+"`")
}

// An upload under commit is not expired, and one discarded meanwhile
// stays charged until the commit ends: its bytes are still held.
func TestStageCommitHoldsTheCharge(t *testing.T) {
	st, clk := newStage(t, nil)
	id := reserve(t, st, decl(connA, 3))
	if _, err := st.Chunk(connA, id, 0, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	p, err := st.Take(connA, id)
	if err != nil || !bytes.Equal(p.Data, []byte("abc")) {
		t.Fatal(err)
	}
	clk.advance(10 * time.Minute)
	st.Renew(connA.Gateway)
	if n := st.Sweep(); n != 0 {
		t.Fatalf("swept an upload under commit")
	}
	charged := st.Stats().Charged
	st.DiscardConnection(connA.Gateway, connA.Conn)
	if s := st.Stats(); s.Charged != charged {
		t.Fatalf("charge released while the commit holds the bytes: %+v", s)
	}
	if err := st.CheckRoom(decl(connA, 1)); err != nil {
		t.Fatalf("the closed connection's slot: %v", err)
	}
	st.Finish(id, true, true)
	if s := st.Stats(); s.Charged != 0 || s.Uploads != 0 {
		t.Fatalf("after the commit: %+v", s)
	}

	// A store that may pass keeps the upload for another commit.
	id = reserve(t, st, decl(connA, 1))
	if _, err := st.Chunk(connA, id, 0, []byte("z")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(connA, id); err != nil {
		t.Fatal(err)
	}
	st.Finish(id, true, true)
	if _, err := st.Take(connA, id); err != nil {
		t.Fatalf("kept upload: %v", err)
	}
	st.Finish(id, false, true)
	if s := st.Stats(); s.Charged != 0 {
		t.Fatalf("after the second commit: %+v", s)
	}
}

// A whole-file attach is charged while it is stored, after idle uploads
// are reclaimed; it is refused when the budget is spent.
func TestStageHoldChargesAttaches(t *testing.T) {
	st, clk := newStage(t, func(u *configclient.Uploads) { u.MaxStagedBytes = 2 << 20 })
	reserve(t, st, decl(connA, 1<<20))
	release, err := st.Hold("shared-operator", true, 1<<19)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Hold("shared-operator", true, 1<<20)
	refused(t, err, rpcerr.ReasonCapacity, uploads.OverBudget)
	release()
	release()
	clk.advance(5 * time.Minute)
	release, err = st.Hold("shared-operator", true, 2<<20)
	if err != nil {
		t.Fatalf("after the idle upload was reclaimed: %v", err)
	}
	if s := st.Stats(); s.Charged != 2<<20 || s.Uploads != 0 {
		t.Fatalf("held %+v", s)
	}
	release()
	if s := st.Stats(); s.Charged != 0 {
		t.Fatalf("after release %+v", s)
	}
}

// A user's attaches count in its share of the budget while they are
// stored, as its uploads do: one paired client sending attaches on many
// connections took the whole budget from everyone else's begins, past
// uploads.max_user_staged_bytes, which bounded its uploads only.
func TestStageHoldChargesTheUsersShare(t *testing.T) {
	st, _ := newStage(t, func(u *configclient.Uploads) {
		u.MaxStagedBytes = 64 << 20
		u.MaxUserStagedBytes = 16 << 20
	})
	release, err := st.Hold("mallory", false, 10<<20)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Hold("mallory", false, 10<<20)
	refused(t, err, rpcerr.ReasonCapacity, uploads.UserStagingFull(10<<20, 10<<20, 16<<20))
	m := decl(Owner{Gateway: "gw-1", Conn: "m-0", Principal: "mallory"}, 10<<20)
	_, err = st.Reserve(m)
	refused(t, err, rpcerr.ReasonCapacity, uploads.UserStagingFull(10<<20, charge("", m)+32, 16<<20))
	// Others, and the operator past any share, still hold.
	for _, who := range []struct {
		p        string
		operator bool
		n        int64
	}{{"alice", false, 10 << 20}, {"shared-operator", true, 20 << 20}} {
		rel, err := st.Hold(who.p, who.operator, who.n)
		if err != nil {
			t.Fatalf("%s: %v", who.p, err)
		}
		defer rel()
	}
	release()
	release()
	if _, ok := st.byUser["mallory"]; ok {
		t.Fatalf("byUser %v after the release", st.byUser)
	}
	reserve(t, st, m)
}

// fill sends data to upload id in chunks of the stage's chunk size.
func fill(t *testing.T, st *Stage, o Owner, id string, data []byte) {
	t.Helper()
	step := int(st.Limits().ChunkBytes)
	for off := 0; off < len(data); off += step {
		if _, err := st.Chunk(o, id, int64(off), data[off:min(off+step, len(data))]); err != nil {
			t.Fatalf("chunk at %d: %v", off, err)
		}
	}
}

// staged stages data as one complete upload and takes it for commit.
func staged(t *testing.T, st *Stage, o Owner, data []byte) Pending {
	t.Helper()
	id := reserve(t, st, decl(o, int64(len(data))))
	fill(t, st, o, id, data)
	p, err := st.Take(o, id)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// noneHeldBeyond fails if the spares' backing array holds a buffer past
// the list's length: one there would stay reachable and counted nowhere.
func noneHeldBeyond(t *testing.T, st *Stage) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, sp := range st.spares[len(st.spares):cap(st.spares)] {
		if sp.buf != nil {
			t.Fatalf("a buffer of %d bytes still held past the %d kept (slot %d)", cap(sp.buf), len(st.spares), len(st.spares)+i)
		}
	}
}

// A finished upload's buffer goes to the next upload it fits with at
// most a quarter to spare: the new upload is copied into pages the
// process has touched already, and sees only its own bytes. While kept,
// the buffer is counted apart from the uploads' charge.
func TestStageReusesAFinishedUploadsBuffer(t *testing.T) {
	st, _ := newStage(t, nil)
	first := staged(t, st, connA, bytes.Repeat([]byte{0xaa}, 5<<18)) // 1.25 MiB
	st.Finish(first.ID, false, true)
	kept := int64(cap(first.Data))
	if s := st.Stats(); s.Charged != 0 || s.Uploads != 0 || s.Spare != kept {
		t.Fatalf("after the first upload: %+v", s)
	}

	want := bytes.Repeat([]byte{0x55}, 1<<20)
	second := staged(t, st, connB, want)
	if &second.Data[:1][0] != &first.Data[:1][0] {
		t.Fatal("the second upload did not get the first one's buffer")
	}
	noneHeldBeyond(t, st)
	if !bytes.Equal(second.Data, want) {
		t.Fatalf("the second upload holds %d bytes, not the %d it was sent", len(second.Data), len(want))
	}
	if s := st.Stats(); s.Spare != 0 || s.Charged < kept || s.Payload != int64(len(want)) {
		t.Fatalf("while the second upload holds the buffer: %+v", s)
	}
	st.Finish(second.ID, false, true)
	if s := st.Stats(); s.Charged != 0 || s.Spare != kept {
		t.Fatalf("after the second upload: %+v", s)
	}

	// Too small for the buffer, or too large: a buffer of its own.
	for _, size := range []int{1<<20 - 1, 2 << 20} {
		p := staged(t, st, connA, make([]byte, size))
		if &p.Data[:1][0] == &first.Data[:1][0] {
			t.Fatalf("an upload of %d bytes got the %d-byte buffer", size, kept)
		}
		st.Finish(p.ID, false, true)
	}
	// A small upload's buffer is not kept; a third large one replaces
	// the oldest.
	if s := st.Stats(); s.Spare != kept+2<<20 || len(st.spares) != maxSpares {
		t.Fatalf("after four uploads: %+v, %d kept", s, len(st.spares))
	}
	st.Finish(staged(t, st, connA, make([]byte, 4<<20)).ID, false, true)
	if s := st.Stats(); s.Spare != 2<<20+4<<20 {
		t.Fatalf("after a fifth upload: %+v", s)
	}
	noneHeldBeyond(t, st)
	// Both taken by uploads under way: nothing is left in the list's array.
	a, b := staged(t, st, connA, make([]byte, 2<<20)), staged(t, st, connB, make([]byte, 4<<20))
	if s := st.Stats(); s.Spare != 0 {
		t.Fatalf("two uploads under way: %+v", s)
	}
	noneHeldBeyond(t, st)
	st.Finish(a.ID, false, true)
	st.Finish(b.ID, false, true)
}

// A buffer a commit's call may still be reading (its loan not given
// back) is never kept for another upload to be written into: not when
// the upload is dropped at once, nor when it is kept for another commit
// that later succeeds. A buffer given back is kept, as before.
func TestStageKeepsNoBufferACallMayRead(t *testing.T) {
	st, _ := newStage(t, nil)
	p := staged(t, st, connA, make([]byte, 2<<20))
	st.Finish(p.ID, false, false)
	if s := st.Stats(); s.Spare != 0 || s.Charged != 0 || s.Uploads != 0 {
		t.Fatalf("dropped while its call may read it: %+v", s)
	}

	q := staged(t, st, connA, make([]byte, 2<<20))
	st.Finish(q.ID, true, false) // kept for another commit
	again, err := st.Take(connA, q.ID)
	if err != nil || &again.Data[:1][0] != &q.Data[:1][0] {
		t.Fatalf("the kept upload taken again: %v", err)
	}
	st.Finish(again.ID, false, true) // this call gave its loan back; the first may not have
	if s := st.Stats(); s.Spare != 0 || s.Uploads != 0 {
		t.Fatalf("dropped after an earlier call that may read it: %+v", s)
	}

	r := staged(t, st, connA, make([]byte, 2<<20))
	st.Finish(r.ID, false, true)
	if s := st.Stats(); s.Spare != int64(cap(r.Data)) {
		t.Fatalf("a buffer given back was not kept: %+v", s)
	}
}

// Kept buffers count against the budget and give way to any upload or
// attach that needs the room; unused for spareIdle, they are dropped.
func TestStageSparesGiveWay(t *testing.T) {
	const budget = 3 << 20
	st, clk := newStage(t, func(u *configclient.Uploads) { u.MaxStagedBytes = budget })
	st.Finish(staged(t, st, connA, make([]byte, 2<<20)).ID, false, true)
	if s := st.Stats(); s.Spare != 2<<20 {
		t.Fatalf("kept %+v", s)
	}
	id := reserve(t, st, decl(connA, 3<<19)) // 1.5 MiB: over the budget beside the spare
	if s := st.Stats(); s.Spare != 0 || s.Charged+s.Spare > budget {
		t.Fatalf("the spare did not give way to an upload: %+v", s)
	}
	noneHeldBeyond(t, st)
	fill(t, st, connA, id, make([]byte, 3<<19))
	p, err := st.Take(connA, id)
	if err != nil {
		t.Fatal(err)
	}
	st.Finish(p.ID, false, true)
	release, err := st.Hold("shared-operator", true, 2<<20)
	if err != nil {
		t.Fatalf("an attach beside a spare: %v", err)
	}
	if s := st.Stats(); s.Spare != 0 || s.Charged != 2<<20 {
		t.Fatalf("the spare did not give way to an attach: %+v", s)
	}
	release()

	st.Finish(staged(t, st, connA, make([]byte, 1<<20)).ID, false, true)
	clk.advance(spareIdle - time.Second)
	st.Renew(connA.Gateway)
	st.Sweep()
	if s := st.Stats(); s.Spare != 1<<20 {
		t.Fatalf("dropped before its time: %+v", s)
	}
	clk.advance(2 * time.Second)
	st.Sweep()
	if s := st.Stats(); s.Spare != 0 || len(st.spares) != 0 {
		t.Fatalf("kept past its time: %+v", s)
	}
	noneHeldBeyond(t, st)
}

// Two commits of one upload (file/upload/commit sent twice without
// waiting) were both handed its bytes; the first to finish gave the
// buffer to the next upload of its size while the second's store still
// read it, and that store sent the other upload's bytes. A commit while
// one runs is refused now, and the upload is left to the first.
func TestStageOneCommitAtATime(t *testing.T) {
	st, _ := newStage(t, nil)
	mine := bytes.Repeat([]byte{0xaa}, 2<<20)
	id := reserve(t, st, decl(connA, int64(len(mine))))
	fill(t, st, connA, id, mine)
	first, err := st.Take(connA, id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Take(connA, id)
	refused(t, err, rpcerr.ReasonInvalid, "Upload `"+id+"` is being committed; its first commit answers with the file")
	if !bytes.Equal(first.Data, mine) {
		t.Fatal("the first commit's bytes changed")
	}
	// A store that may pass keeps the upload: a commit after it is served.
	st.Finish(id, true, true)
	again, err := st.Take(connA, id)
	if err != nil || !bytes.Equal(again.Data, mine) {
		t.Fatalf("a commit after the first ended: %v", err)
	}
	st.Finish(id, false, true)
	if s := st.Stats(); s.Uploads != 0 {
		t.Fatalf("after the commit: %+v", s)
	}
}

// One user's connections together stage at most
// uploads.max_user_staged_bytes: a paired client opening connections
// cannot take the whole budget from the others. The operator is not
// bounded by it; a user's idle uploads give way to its new one.
func TestStagePerUserBudget(t *testing.T) {
	st, clk := newStage(t, func(u *configclient.Uploads) {
		u.MaxStagedBytes = 64 << 20
		u.MaxUserStagedBytes = 16 << 20
	})
	mallory := func(i int) Owner {
		return Owner{Gateway: "gw-1", Conn: fmt.Sprintf("m-%d", i), Principal: "mallory"}
	}
	var ids []string
	for i := range 3 {
		ids = append(ids, reserve(t, st, decl(mallory(i), 5<<20)))
	}
	// 15 MiB and the metadata staged: another 5 MiB, on a new
	// connection, passes mallory's share though the budget has room.
	d := decl(mallory(3), 5<<20)
	_, err := st.Reserve(d)
	held := 3 * charge(ids[0], decl(mallory(0), 5<<20))
	refused(t, err, rpcerr.ReasonCapacity, uploads.UserStagingFull(held, charge("", d)+32, 16<<20))

	// Another user and the operator still begin.
	alice := Owner{Gateway: "gw-1", Conn: "a-0", Principal: "alice"}
	reserve(t, st, decl(alice, 5<<20))
	op := decl(Owner{Gateway: "gw-1", Conn: "o-0", Principal: "shared-operator"}, 20<<20)
	op.Operator = true
	reserve(t, st, op)

	// A finished upload gives its share back.
	if _, err := st.Chunk(mallory(0), ids[0], 0, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	st.DiscardConnection("gw-1", "m-0")
	reserve(t, st, decl(mallory(3), 5<<20))
	// Idle uploads of mallory's go to make room for a new one.
	clk.advance(6 * time.Minute)
	reserve(t, st, decl(mallory(4), 10<<20))
	// Everything else was idle too and went: mallory holds the new one
	// only, and nobody else has an entry (the operator never had one).
	if want := charge("", decl(mallory(4), 10<<20)) + 32; len(st.byUser) != 1 || st.byUser["mallory"] != want {
		t.Fatalf("byUser %v, want mallory's %d only", st.byUser, want)
	}
}

// Resending an accepted chunk is acknowledged but is not activity: an
// upload that only repeats itself goes idle and is reclaimed, so its
// charge is not held for ever.
func TestStageResendDoesNotKeepAnUploadAlive(t *testing.T) {
	st, clk := newStage(t, nil)
	id := reserve(t, st, decl(connA, 6))
	if _, err := st.Chunk(connA, id, 0, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		clk.advance(time.Minute)
		if _, err := st.Chunk(connA, id, 0, []byte("abc")); err != nil {
			refused(t, err, rpcerr.ReasonNotFound, "Unknown or expired upload `"+id+"`")
			return
		}
	}
	t.Fatal("an upload resending one chunk every minute was never expired")
}

// A begin sent again on its connection for the same declared content
// (its reply lost to a client's timeout) was staged and charged a second
// time: a user with room for the file once was refused for the content
// it already staged, and four such retries filled the connection. The
// upload already staged is resumed now: the same id, no new charge, the
// bytes received kept (resent, they are acknowledged). Only a begin
// declaring a hash is resumed, on the connection that began it, with
// every declared field the same; it is not activity.
func TestStageBeginSentAgainResumesTheUpload(t *testing.T) {
	st, clk := newStage(t, func(u *configclient.Uploads) { u.MaxUserStagedBytes = 15 << 20 })
	alice := Owner{Gateway: "gw-1", Conn: "a-0", Principal: "alice"}
	data := bytes.Repeat([]byte("r"), 10<<20)
	d := decl(alice, int64(len(data)))
	d.SHA256 = uploads.Sum(data)
	id := reserve(t, st, d)
	if _, err := st.Chunk(alice, id, 0, data[:1<<20]); err != nil {
		t.Fatal(err)
	}
	before := st.Stats()
	clk.advance(time.Minute)
	for range 5 {
		if again := reserve(t, st, d); again != id {
			t.Fatalf("begin sent again: upload %s, want %s", again, id)
		}
	}
	if after := st.Stats(); after != before || st.byUser["alice"] != before.Charged {
		t.Fatalf("stats %+v after the begins sent again, %+v before; alice %d", after, before, st.byUser["alice"])
	}
	if got, err := st.Chunk(alice, id, 0, data[:1<<20]); err != nil || got != 1<<20 {
		t.Fatalf("resent chunk: %d %v", got, err)
	}
	// Not activity: it expires when it would have.
	clk.advance(4 * time.Minute)
	if _, err := st.Chunk(alice, id, 1<<20, data[1<<20:2<<20]); err == nil {
		t.Fatal("an upload kept alive by begins sent again")
	}

	// Anything else is a new upload: no hash, another filename, another
	// connection of the same user.
	d = decl(alice, 5)
	d.SHA256 = uploads.Sum([]byte("hello"))
	id = reserve(t, st, d)
	for _, other := range []func(*Declared){
		func(o *Declared) { o.SHA256 = "" },
		func(o *Declared) { o.Filename = "other.bin" },
		func(o *Declared) { o.Owner.Conn = "a-1" },
	} {
		o := d
		other(&o)
		if again := reserve(t, st, o); again == id {
			t.Fatalf("%+v resumed %+v", o, d)
		}
	}
	// A full connection is no refusal for a begin it resumes, before
	// the session is checked (CheckRoom) or after; the session changed
	// since (another generation) is.
	reserve(t, st, decl(alice, 1))
	asDeclared := d
	asDeclared.Generation, asDeclared.Incarnation, asDeclared.SessionOwner, asDeclared.Agent = 0, 0, "", ""
	if err := st.CheckRoom(asDeclared); err != nil {
		t.Fatalf("room for a begin sent again on a full connection: %v", err)
	}
	if again := reserve(t, st, d); again != id {
		t.Fatalf("begin sent again on a full connection: %s, want %s", again, id)
	}
	d.Generation++
	_, err := st.Reserve(d)
	refused(t, err, rpcerr.ReasonCapacity, uploads.TooManyForConnection(4))
}
