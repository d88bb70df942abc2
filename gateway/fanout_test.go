package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/countio"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// Every update of every session reaches every attached connection, in
// the session's order, while several sessions publish at once and the
// connections read at different paces (updates are encoded once per
// update and written by the fan-out itself while a connection's output is
// idle, else from its outbox). Over a Unix socket, with some updates
// larger than the socket's buffer and slow readers, the two ways take
// turns within one stream; over net.Pipe, which cannot be written
// without waiting, every update goes through the outbox.
func TestFanoutOrderPerConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		pair func(testing.TB) (server, client net.Conn)
		big  int // every big-th update carries 256 KiB of text
	}{
		{"unix", unixPair, 25},
		{"pipe", func(testing.TB) (net.Conn, net.Conn) { return net.Pipe() }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) { fanoutInOrder(t, tc.pair, tc.big) })
	}
}

// unixPair returns the two ends of a connected Unix stream socket.
func unixPair(t testing.TB) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = c
	}
	return ends[0], ends[1]
}

func fanoutInOrder(t *testing.T, pair func(testing.TB) (net.Conn, net.Conn), big int) {
	url := testenv.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	const conns, sessions, updates = 4, 6, 300
	g := &Gateway{log: testenv.Logger(t)}
	h := newHub(nc, testenv.Logger(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	var states []*connState
	defer func() {
		cancel()
		for _, cs := range states {
			h.detach(cs, "")
			cs.outbox.close()
			cs.conn.Close()
		}
		g.wg.Wait()
	}()

	sessionIDs := make([]string, sessions)
	for i := range sessionIDs {
		sessionIDs[i] = ids.New("s-")
	}
	type seen struct {
		mu   sync.Mutex
		last map[string]int
		n    int
		errs []string
	}
	results := make([]*seen, conns)
	var readers sync.WaitGroup
	for c := range conns {
		server, client := pair(t)
		conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: testenv.Logger(t)})
		g.spawn(func() { _ = conn.Run(ctx) })
		t.Cleanup(func() { conn.Close(); client.Close() })
		cs := &connState{id: fmt.Sprintf("conn-%d", c), conn: conn}
		cs.outbox = newOutbox(ctx, g, cs)
		states = append(states, cs)
		g.spawn(cs.outbox.run)
		for _, id := range sessionIDs {
			subject, err := bus.SessionUpdateSubject(id, 1)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := h.attach(cs, id, subject, -1, true, false); err != nil {
				t.Fatal(err)
			}
		}
		res := &seen{last: map[string]int{}}
		results[c] = res
		readers.Add(1)
		go func() {
			defer readers.Done()
			r := bufio.NewReader(client)
			for {
				if c%2 == 1 {
					time.Sleep(50 * time.Microsecond) // a slower reader
				}
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				var f struct {
					Method string `json:"method"`
					Params struct {
						SessionID string `json:"session_id"`
						Seq       int    `json:"seq"`
					} `json:"params"`
				}
				if err := json.Unmarshal(line, &f); err != nil || f.Method != "session/update" {
					res.mu.Lock()
					res.errs = append(res.errs, fmt.Sprintf("frame %q: %v", line, err))
					res.mu.Unlock()
					continue
				}
				res.mu.Lock()
				if want := res.last[f.Params.SessionID] + 1; f.Params.Seq != want {
					res.errs = append(res.errs, fmt.Sprintf("session %s: update %d after %d", f.Params.SessionID, f.Params.Seq, want-1))
				}
				res.last[f.Params.SessionID] = f.Params.Seq
				res.n++
				res.mu.Unlock()
			}
		}()
	}

	var pubs sync.WaitGroup
	for _, id := range sessionIDs {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			p, err := bus.NewSessionUpdatePublisher(pub, id, 1)
			if err != nil {
				t.Error(err)
				return
			}
			for k := 1; k <= updates; k++ {
				text := "x"
				if big > 0 && k%big == 0 {
					text = strings.Repeat("y", 256<<10)
				}
				body := fmt.Sprintf(`{"session_id":%q,"seq":%d,"type":"agent_message_chunk","text":%q}`, id, k, text)
				if err := p.Publish(busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, int64(k), []byte(body)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	pubs.Wait()
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}

	// The readers' pace is the machine's: under load a reader's 50 µs
	// pause is a scheduler's time slice, and 1800 of them took over a
	// minute. The wait lasts while updates keep arriving anywhere; an
	// update lost or a connection closed stops the count short of the
	// total for good.
	counts := make([]int, conns)
	defer func() {
		if t.Failed() {
			t.Logf("updates read per connection: %v of %d", counts, sessions*updates)
		}
	}()
	testwait.Progress(t, 10*time.Millisecond, func() (int64, bool) {
		var total int64
		done := true
		for c, res := range results {
			res.mu.Lock()
			n, errs := res.n, res.errs
			res.mu.Unlock()
			if len(errs) > 0 {
				t.Fatalf("connection %d: %v", c, errs[:min(len(errs), 5)])
			}
			counts[c] = n
			total += int64(n)
			done = done && n == sessions*updates
		}
		return total, done
	})
}

// BenchmarkFanOut hands a streamed chunk's update to the fan-out of a
// session one connection follows, as a bus delivery does, and the
// fan-out writes it to the connection's Unix socket, whose other end a
// reader drains. allocs/op and B/op are the garbage an update leaves in
// the gateway's own code; the bus message itself is nats.go's (in the
// thirty-first round's measure, 689-694 B a chunk in all, this part 320 B
// and one allocation, the frame, until the thirty-second round).
func BenchmarkFanOut(b *testing.B) {
	server, client := unixPair(b)
	g := &Gateway{log: zap.NewNop()}
	h := newHub(nil, zap.NewNop(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: zap.NewNop()})
	g.spawn(func() { _ = conn.Run(ctx) })
	cs := &connState{id: "conn-0", conn: conn}
	cs.outbox = newOutbox(ctx, g, cs)
	g.spawn(cs.outbox.run)
	tp := &topic{conns: map[*connState]bool{cs: false}}
	read := countio.Start(client)

	const id = "s_0123456789abcdef01234567"
	u := bus.Update{SessionID: id, Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK,
		JSON: []byte(`{"content":{"text":"1796357943194065258 ","type":"text"},"session_id":"` + id + `","sessionId":"` + id + `","sessionUpdate":"agent_message_chunk","turn_id":"t_0123456789abcdef01234567","type":"agent_message_chunk"}`)}
	frame := int64(len(`{"jsonrpc":"2.0","method":"session/update","params":}`+"\n") + len(u.JSON))
	var sent int64
	b.ReportAllocs()
	for b.Loop() {
		sent++
		u.Seq = sent
		h.dispatch(tp, u)
		// A stream's chunks come paced, each read by the client before
		// the next comes (the turn-stream benchmark's pace is one a
		// session every 5 ms): the next waits for this one's bytes to
		// reach the reader, so each update is written to an idle socket,
		// one write each, as in the stack. Waiting only until the outbox
		// had handed it to the connection (its progress) let the
		// connection's queue grow to megabytes behind a reader starved at
		// -cpu 1, and the benchmark measured batched writes of many
		// updates. A connection that failed never has the bytes read.
		// It blocks rather than spins: a spinning loop kept the reader,
		// woken only from the network poller, off the one processor.
		if !read.WaitFor(sent*frame, conn.Done()) {
			b.Fatalf("the connection or its reader ended after %d of %d bytes were read", read.N(), sent*frame)
		}
	}
	b.StopTimer()
	cs.outbox.close()
	conn.Close()
	cancel()
	g.wg.Wait()
	client.Close()
	if n := read.Wait(); n != sent*frame {
		b.Fatalf("%d bytes reached the socket's reader, want %d updates of %d", n, sent, frame)
	}
}

// A deleted session's id may name a new session at once, and the
// deletion's update may reach the hub after the new session's
// connections attach: under load it did (TestDeletionDetachesBefore
// TheIDIsReused saw alice's turn complete with none of its updates).
// The new session's subject names its incarnation, a later one than the
// deleted session's: its connections get a topic of their own whichever
// path attached them first (session/new of the connection that made it,
// a resume or a prompt of her other connection in the instant before,
// or either of a session made where this hub did not see it), and the
// late deletion drops only the deleted session's topic. Before
// incarnations (the forty-fourth round) the hub dropped the held topic
// only when session/new had created the session: an attach that came
// first joined the deleted session's topic and was detached with it.
func TestDeletionArrivingAfterTheIDIsReused(t *testing.T) {
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	h := newHub(nc, zap.NewNop(), nil)
	id := ids.New("s-")
	before, err := bus.SessionUpdateSubject(id, 7)
	if err != nil {
		t.Fatal(err)
	}
	after, err := bus.SessionUpdateSubject(id, 8)
	if err != nil {
		t.Fatal(err)
	}
	operator := &connState{id: "operator"}
	loaded, made := &connState{id: "alice-load"}, &connState{id: "alice-new"}
	if _, _, err := h.attach(operator, id, before, -1, false, false); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	deleted := h.topics[id]
	h.mu.Unlock()

	for _, cs := range []*connState{loaded, made} {
		if _, _, err := h.attach(cs, id, after, -1, false, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := h.attached(operator, id); ok {
		t.Fatal("the deleted session's follower follows the new session")
	}
	// A subject the session service gave for the deleted session, used
	// after the new one's: refused, not joined.
	if _, _, err := h.attach(operator, id, before, -1, false, false); !errors.Is(err, errReplaced) {
		t.Fatalf("attach on the deleted session's subject: %v", err)
	}
	// The deleted session's last update, on its own topic, late.
	h.dispatch(deleted, bus.Update{SessionID: id, Type: busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED})
	for _, cs := range []*connState{loaded, made} {
		if n, ok := h.attached(cs, id); !ok || n != 8 {
			t.Errorf("%s was detached from the new session by the deletion of the one its id named before", cs.id)
		}
	}
	// The new session's own deletion detaches them.
	h.mu.Lock()
	current := h.topics[id]
	h.mu.Unlock()
	h.dispatch(current, bus.Update{SessionID: id, Type: busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED})
	if _, ok := h.attached(loaded, id); ok {
		t.Error("the new session's deletion left its followers attached")
	}
	if _, ok := h.attached(made, id); ok {
		t.Error("the new session's deletion left its followers attached")
	}
}
