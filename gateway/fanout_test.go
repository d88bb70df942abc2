package gateway

import (
	"bufio"
	"context"
	"encoding/json"
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
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/testenv"
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
		pair func(t *testing.T) (server, client net.Conn)
		big  int // every big-th update carries 256 KiB of text
	}{
		{"unix", unixPair, 25},
		{"pipe", func(*testing.T) (net.Conn, net.Conn) { return net.Pipe() }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) { fanoutInOrder(t, tc.pair, tc.big) })
	}
}

// unixPair returns the two ends of a connected Unix stream socket.
func unixPair(t *testing.T) (net.Conn, net.Conn) {
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

func fanoutInOrder(t *testing.T, pair func(t *testing.T) (net.Conn, net.Conn), big int) {
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
	g := &Gateway{log: zap.NewNop()}
	h := newHub(nc, zap.NewNop())
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
		conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: zap.NewNop()})
		g.spawn(func() { _ = conn.Run(ctx) })
		t.Cleanup(func() { conn.Close(); client.Close() })
		cs := &connState{id: fmt.Sprintf("conn-%d", c), conn: conn}
		cs.outbox = newOutbox(ctx, g, cs)
		states = append(states, cs)
		g.spawn(cs.outbox.run)
		for _, id := range sessionIDs {
			subject, err := bus.SessionUpdateSubject(id)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h.attach(cs, id, subject); err != nil {
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
			p, err := bus.NewSessionUpdatePublisher(pub, id)
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

	deadline := time.Now().Add(30 * time.Second)
	for c, res := range results {
		for {
			res.mu.Lock()
			n, errs := res.n, res.errs
			res.mu.Unlock()
			if len(errs) > 0 {
				t.Fatalf("connection %d: %v", c, errs[:min(len(errs), 5)])
			}
			if n == sessions*updates {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("connection %d: %d of %d updates", c, n, sessions*updates)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
