package gateway

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"testing"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/ids"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// The outbox's bound is on the memory its backlog holds, not on the
// updates' JSON alone: with streamed chunks of about 140 B of JSON, each
// queued entry held its slot in the queue and the bus message the JSON
// is cut from besides, 2.3 times the bound in all. The heap a connection
// that never reads holds, its backlog filled up to the bound, stays
// within a quarter more than the bound (the heap after a collection: a
// bound on memory, not on time).
func TestOutboxBoundIsOnMemoryHeld(t *testing.T) {
	server, client := net.Pipe() // nobody reads client: every push queues
	defer client.Close()
	conn := jsonrpc.NewConn(server, nil, jsonrpc.Options{InitializeTimeout: -1, Logger: zap.NewNop()})
	defer conn.Close()
	g := &Gateway{log: zap.NewNop()}
	o := newOutbox(context.Background(), g, &connState{id: "conn-t", conn: conn})
	sid := ids.New("s-")
	turn := ids.New("turn_")
	// An update as the hub gets it: the JSON is a slice of the delivered
	// message, which nats.go copies into a buffer of its own, and the
	// session id the subscription's own string.
	update := func(seq int64) bus.Update {
		params := fmt.Sprintf(`{"session_id":%q,"sessionId":%q,"text":"tok%d","turn_id":%q,"type":"agent_message_chunk"}`, sid, sid, seq%10, turn)
		data, err := proto.Marshal(&busv1.SessionUpdate{SessionId: sid, Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: seq, Json: params})
		if err != nil {
			t.Fatal(err)
		}
		// The JSON is the message's last field.
		return bus.Update{SessionID: sid, Incarnation: 1, Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: seq, JSON: data[len(data)-len(params):]}
	}
	jsonLen := len(update(1).JSON)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := int64(0)
	for {
		u := update(n + 1)
		if o.bytes+entryBytes(u) > maxOutboxBytes {
			break // the next would close the connection
		}
		nt, err := jsonrpc.EncodeRawNotification("session/update", u.JSON)
		if err != nil {
			t.Fatal(err)
		}
		o.push(u, nt)
		n++
	}
	if o.done || len(o.q) != int(n) {
		t.Fatalf("%d of %d updates queued (connection closed: %v)", len(o.q), n, o.done)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	ratio := float64(held) / float64(maxOutboxBytes)
	t.Logf("%d updates of %d B of JSON queued, %d B counted; %d B of heap held, %.0f B an update (%.2f times the bound)",
		n, jsonLen, o.bytes, held, float64(held)/float64(n), ratio)
	if ratio > 1.25 {
		t.Errorf("a connection's backlog holds %.1f MiB of heap under a %d MiB bound (%.2f times)", float64(held)/(1<<20), maxOutboxBytes>>20, ratio)
	}
	runtime.KeepAlive(o)
}
