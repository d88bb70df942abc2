package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	"go.uber.org/zap"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A prompt collects its turn's completion whether it asks before or after
// the turn_complete was written; only the sessions with a prompt in
// flight have their completions remembered, at most maxRecentTurns each,
// and none once their prompts ended.
func TestOutboxTurnCompletions(t *testing.T) {
	o := newOutbox(context.Background(), nil, nil)
	complete := func(session, turn string) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.sent(bus.Update{SessionID: session, Type: busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE,
			JSON: []byte(fmt.Sprintf(`{"turn_id":%q}`, turn))})
	}
	o.promptBegins("s")
	early := o.turnDone("t-early")
	if closed(early) {
		t.Fatal("completed before its turn_complete")
	}
	complete("s", "t-early")
	if !closed(early) {
		t.Fatal("a waiting prompt was not woken")
	}
	o.forgetTurn("t-early")

	complete("s", "t-late")
	for i := range 10 * maxRecentTurns {
		complete("followed", fmt.Sprintf("other-%d", i)) // no prompt of it in flight
	}
	if !closed(o.turnDone("t-late")) {
		t.Fatal("a completion written before the prompt asked was lost")
	}
	o.forgetTurn("t-late")
	if n := len(o.completed); n != 0 {
		t.Fatalf("%d completions of sessions with no prompt in flight remembered", n)
	}

	for i := range 10 * maxRecentTurns {
		complete("s", fmt.Sprintf("crowd-%d", i))
	}
	if n := len(o.completed); n > maxRecentTurns {
		t.Fatalf("%d completions remembered, want at most %d", n, maxRecentTurns)
	}
	if !closed(o.turnDone(fmt.Sprintf("crowd-%d", 10*maxRecentTurns-1))) {
		t.Fatal("the most recent completion was dropped")
	}
	o.promptEnds("s")
	if n, m := len(o.completed), len(o.bySession); n != 0 || m != 0 {
		t.Fatalf("%d completions of %d sessions remembered after their prompts ended", n, m)
	}
}

// A connection whose update backlog passes its bound is closed, never
// left to grow nor fed a stream with a hole in it.
func TestOutboxBacklogBounded(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{})
	g := &Gateway{log: zap.NewNop()}
	o := newOutbox(context.Background(), g, &connState{id: "conn-t", conn: conn})
	chunk := bus.Update{JSON: []byte(strings.Repeat("x", 1<<20-outboxEntryOverhead))} // 1 MiB charged
	for range maxOutboxBytes >> 20 {
		o.push(chunk, jsonrpc.Notification{})
	}
	if o.bytes != maxOutboxBytes || len(o.q) != maxOutboxBytes>>20 {
		t.Fatalf("queued %d bytes in %d updates", o.bytes, len(o.q))
	}
	o.push(chunk, jsonrpc.Notification{}) // one past the bound
	g.wg.Wait()
	if !closed(conn.Done()) {
		t.Fatal("the connection is still open past its backlog bound")
	}
	if o.bytes != 0 || len(o.q) != 0 || !o.done {
		t.Fatalf("backlog kept: %d bytes, %d updates", o.bytes, len(o.q))
	}
	o.push(chunk, jsonrpc.Notification{})
	if len(o.q) != 0 {
		t.Fatal("an update was queued after the close")
	}
}

// Every outbox is bounded alone, and all of them together: past the
// gateway's bound, a connection holding more than its share is closed,
// one holding little keeps its updates, and what a closed one held is
// given back to the others.
func TestGatewayBacklogBounded(t *testing.T) {
	g := &Gateway{log: zap.NewNop(), output: jsonrpc.NewOutputBudget(8 << 20)}
	open := func(id string) (*outbox, *jsonrpc.Conn) {
		server, client := net.Pipe()
		t.Cleanup(func() { client.Close() })
		conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{})
		return newOutbox(context.Background(), g, &connState{id: id, conn: conn}), conn
	}
	chunk := bus.Update{JSON: []byte(strings.Repeat("x", 1<<20-outboxEntryOverhead))} // 1 MiB charged
	push := func(o *outbox, n int) {
		for range n {
			o.push(chunk, jsonrpc.Notification{})
		}
	}
	a, aConn := open("conn-a")
	b, bConn := open("conn-b")
	c, cConn := open("conn-c")
	push(a, 5)
	push(b, 3) // 8 MiB in all: at the bound, not past it
	if got := g.output.Held(); got != 8<<20 || a.ended() || b.ended() {
		t.Fatalf("backlog %d, a ended %v, b ended %v", got, a.ended(), b.ended())
	}
	push(b, 1) // past it, and b holds more than its share
	g.wg.Wait()
	if !closed(bConn.Done()) || g.output.Held() != 5<<20 {
		t.Fatalf("b open %v, backlog %d after b passed the gateway's bound", !closed(bConn.Done()), g.output.Held())
	}
	push(c, 4) // c's last MiB passes the bound with c past its share
	g.wg.Wait()
	if !closed(cConn.Done()) || g.output.Held() != 5<<20 {
		t.Fatalf("c open %v, backlog %d", !closed(cConn.Done()), g.output.Held())
	}
	c2, _ := open("conn-c2")
	push(c2, 2)
	if c2.ended() || g.output.Held() != 7<<20 {
		t.Fatalf("a connection within its share past the bound: ended %v, backlog %d", c2.ended(), g.output.Held())
	}
	push(a, 2) // a, holding the most, is closed
	g.wg.Wait()
	if !closed(aConn.Done()) || g.output.Held() != 2<<20 || c2.ended() {
		t.Fatalf("a open %v, backlog %d, c2 ended %v", !closed(aConn.Done()), g.output.Held(), c2.ended())
	}
	c2.close()
	if got := g.output.Held(); got != 0 {
		t.Fatalf("backlog %d once every outbox is closed", got)
	}
}

// A backlog larger than one batch goes out in several, bounded by the
// frames' bytes, every update once and in order.
func TestOutboxBatchesSplitInOrder(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: zap.NewNop()})
	g := &Gateway{log: zap.NewNop()}
	ctx, cancel := context.WithCancel(context.Background())
	g.spawn(func() { _ = conn.Run(ctx) })
	o := newOutbox(ctx, g, &connState{id: "conn-t", conn: conn})
	const updates = 600 // 600 KiB of frames: three batches or more
	for k := 1; k <= updates; k++ {
		body := fmt.Sprintf(`{"seq":%d,"text":%q}`, k, strings.Repeat("x", 1000))
		n, err := jsonrpc.EncodeNotification("session/update", json.RawMessage(body))
		if err != nil {
			t.Fatal(err)
		}
		o.push(bus.Update{Seq: int64(k), JSON: []byte(body)}, n)
	}
	if len(o.q) != updates {
		t.Fatalf("%d queued", len(o.q))
	}
	g.spawn(o.run)
	r := bufio.NewReader(client)
	for k := 1; k <= updates; k++ {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var f struct {
			Params struct{ Seq int } `json:"params"`
		}
		if err := json.Unmarshal(line, &f); err != nil || f.Params.Seq != k {
			t.Fatalf("frame %d: seq %d (%v)", k, f.Params.Seq, err)
		}
	}
	o.close()
	cancel()
	conn.Close()
	g.wg.Wait()
}
