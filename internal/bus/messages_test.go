package bus

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/clawmesh/clawmesh/internal/testenv"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// The publisher's hand-made encoding is the one proto.Marshal gives, for
// every field set or left empty, and its field numbers are the proto's.
func TestSessionUpdateEncodingIsProtoMarshal(t *testing.T) {
	fields := (&busv1.SessionUpdate{}).ProtoReflect().Descriptor().Fields()
	for name, n := range map[string]protowire.Number{
		"session_id": fieldUpdateSessionID, "type": fieldUpdateType, "seq": fieldUpdateSeq, "json": fieldUpdateJSON,
	} {
		if f := fields.ByName(protoreflect.Name(name)); f == nil || f.Number() != n {
			t.Fatalf("field %s: descriptor %v, encoder uses %d", name, f, n)
		}
	}
	cases := []*busv1.SessionUpdate{
		{},
		{SessionId: "s-1"},
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: 1, Json: `{"text":"x"}`},
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE, Seq: 1 << 40, Json: strings.Repeat("é", 70000)},
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED},
		{SessionId: "s-abc", Seq: -1, Json: "{}"},
	}
	for _, u := range cases {
		want, err := proto.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		got := appendSessionUpdate([]byte("junk")[:0], u.SessionId, u.Type, u.Seq, []byte(u.Json))
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: encoded %x, proto.Marshal %x", u, got, want)
		}
	}
}

// Updates published one after another, through the reused buffer, arrive
// intact and in order, a large one among them.
func TestSessionUpdatePublisherRoundTrip(t *testing.T) {
	url := testenv.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := NewSessionUpdatePublisher(nc, "bad.id"); err == nil {
		t.Fatal("a publisher for an id that is not a token")
	}
	p, err := NewSessionUpdatePublisher(nc, "s-round")
	if err != nil {
		t.Fatal(err)
	}
	subject, _ := SessionUpdateSubject("s-round")
	got := make(chan *busv1.SessionUpdate, 16)
	sub, err := SubscribeSessionUpdates(nc, subject, func(u *busv1.SessionUpdate) { got <- u }, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Invalid UTF-8, which proto.Marshal refuses and every receiver would
	// drop, is refused at the publisher.
	if err := p.Publish(busv1.UpdateType_UPDATE_TYPE_TOOL_CALL, 9, []byte("{\"raw_input\":\"\xff\"}")); !errors.Is(err, ErrEncode) {
		t.Fatalf("invalid UTF-8 published: %v", err)
	}
	bodies := []string{`{"a":1}`, strings.Repeat("x", maxKeptUpdateBuffer+1), `{"b":2}`}
	for i, body := range bodies {
		if err := p.Publish(busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, int64(i+1), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for i, body := range bodies {
		select {
		case u := <-got:
			if u.GetSessionId() != "s-round" || u.GetSeq() != int64(i+1) || u.GetJson() != body ||
				u.GetType() != busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK {
				t.Fatalf("update %d: %v", i+1, u)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("update %d not received", i+1)
		}
	}
}
