package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
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
// update and written from each connection's outbox).
func TestFanoutOrderPerConnection(t *testing.T) {
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
		server, client := net.Pipe()
		conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: zap.NewNop()})
		g.spawn(func() { _ = conn.Run(ctx) })
		t.Cleanup(func() { conn.Close(); client.Close() })
		cs := &connState{id: fmt.Sprintf("conn-%d", c), conn: conn}
		cs.outbox = newOutbox(g, cs)
		states = append(states, cs)
		g.spawn(func() { cs.outbox.run(ctx) })
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
					time.Sleep(20 * time.Microsecond) // a slower reader
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
				body := fmt.Sprintf(`{"session_id":%q,"seq":%d,"type":"agent_message_chunk","text":"x"}`, id, k)
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
