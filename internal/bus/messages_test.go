package bus

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
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
		"connection_id": fieldUpdateConnectionID, "renumbered": fieldUpdateRenumbered, "turn_started_by": fieldUpdateTurnStartedBy,
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
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: 1025, Json: "{}", Renumbered: true},
	}
	for _, u := range cases {
		want, err := proto.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		got := appendSessionUpdate([]byte("junk")[:0], u.SessionId, u.Type, u.Seq, []byte(u.Json), u.Renumbered)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: encoded %x, proto.Marshal %x", u, got, want)
		}
	}
}

// connect connects to the tests' NATS server, until the test ends.
func connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Updates published one after another, through the reused buffer, arrive
// intact and in order, a large one among them.
func TestSessionUpdatePublisherRoundTrip(t *testing.T) {
	nc := connect(t)
	if _, err := NewSessionUpdatePublisher(nc, "bad.id", 1); err == nil {
		t.Fatal("a publisher for an id that is not a token")
	}
	p, err := NewSessionUpdatePublisher(nc, "s-round", 3)
	if err != nil {
		t.Fatal(err)
	}
	subject, _ := SessionUpdateSubject("s-round", 3)
	got := make(chan Update, 16)
	sub, err := SubscribeSessionUpdates(nc, subject, func(u Update) { got <- u }, func(err error) { t.Error(err) })
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
	before := time.Now().UnixMicro()
	for i, body := range bodies {
		if err := p.Publish(busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, int64(i+1), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for i, body := range bodies {
		select {
		case u := <-got:
			if u.SessionID != "s-round" || u.Incarnation != 3 || u.Seq != int64(i+1) || string(u.JSON) != body ||
				u.Type != busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK {
				t.Fatalf("update %d: %v", i+1, u)
			}
			// The publisher's clock goes with it, for a durable pane's times.
			if u.MadeUnixMicros < before || u.MadeUnixMicros > time.Now().UnixMicro() {
				t.Fatalf("update %d made at %d, published from %d", i+1, u.MadeUnixMicros, before)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("update %d not received", i+1)
		}
	}
}

// SubscribeAllSessionUpdates delivers every session's updates, each with
// its subject's session and incarnation, in each session's order, and drops as bad an
// update claiming another session than its subject's or one that does
// not decode.
func TestSubscribeAllSessionUpdates(t *testing.T) {
	nc := connect(t)
	got := make(chan Update, 64)
	bad := make(chan error, 8)
	sub, err := SubscribeAllSessionUpdates(nc, func(u Update) { got <- u }, func(err error) { bad <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	pubs := map[string]*SessionUpdatePublisher{}
	incarnations := map[string]int64{"s-one": 1, "s-two": 12}
	for id, n := range incarnations {
		if pubs[id], err = NewSessionUpdatePublisher(nc, id, n); err != nil {
			t.Fatal(err)
		}
	}
	subjectOfTwo, _ := SessionUpdateSubject("s-two", 12)
	claimsOne := appendSessionUpdate(nil, "s-one", busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, 99, []byte(`{"x":1}`), false)
	const perSession = 5
	for k := 1; k <= perSession; k++ {
		for _, id := range []string{"s-one", "s-two"} {
			if err := pubs[id].Publish(busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, int64(k), []byte(fmt.Sprintf(`{"k":%d}`, k))); err != nil {
				t.Fatal(err)
			}
		}
		if k == 2 {
			if err := nc.Publish(subjectOfTwo, claimsOne); err != nil {
				t.Fatal(err)
			}
			if err := nc.Publish(subjectOfTwo, []byte{0xff, 0xff}); err != nil {
				t.Fatal(err)
			}
		}
	}
	last := map[string]int64{}
	for range 2 * perSession {
		select {
		case u := <-got:
			if u.Seq != last[u.SessionID]+1 || u.Incarnation != incarnations[u.SessionID] || string(u.JSON) != fmt.Sprintf(`{"k":%d}`, u.Seq) {
				t.Fatalf("after update %d of %s: %+v", last[u.SessionID], u.SessionID, u)
			}
			last[u.SessionID] = u.Seq
		case <-time.After(10 * time.Second):
			t.Fatalf("updates received: %v", last)
		}
	}
	if last["s-one"] != perSession || last["s-two"] != perSession {
		t.Fatalf("updates received: %v", last)
	}
	for range 2 {
		select {
		case err := <-bad:
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("bad update reported as %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a bad update was not reported")
		}
	}
	select {
	case u := <-got:
		t.Fatalf("a bad update was delivered: %+v", u)
	default:
	}
}

// decodeSessionUpdate reads what proto.Unmarshal reads, refuses what it
// refuses, and refuses an update of another session than the
// subscription's.
func TestDecodeSessionUpdateIsProtoUnmarshal(t *testing.T) {
	valid := func(u *busv1.SessionUpdate) []byte {
		b, err := proto.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	chunk := valid(&busv1.SessionUpdate{SessionId: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: 7, Json: `{"text":"x"}`})
	tag := func(b []byte, n protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(b, n, typ) }
	for name, data := range map[string][]byte{
		"chunk":              chunk,
		"to one connection":  valid(&busv1.SessionUpdate{SessionId: "s-1", Seq: 1, Json: "{}", ConnectionId: "c-9"}),
		"deleted":            valid(&busv1.SessionUpdate{SessionId: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED}),
		"negative seq":       valid(&busv1.SessionUpdate{SessionId: "s-1", Seq: -1, Json: "{}"}),
		"unknown enum value": valid(&busv1.SessionUpdate{SessionId: "s-1", Type: busv1.UpdateType(99)}),
		"large json":         valid(&busv1.SessionUpdate{SessionId: "s-1", Json: strings.Repeat("é", 70000)}),
		"another session":    valid(&busv1.SessionUpdate{SessionId: "s-2", Json: "{}"}),
		"no session":         valid(&busv1.SessionUpdate{Json: "{}"}),
		"empty":              {},
		"fields reversed": protowire.AppendString(tag(protowire.AppendVarint(tag(protowire.AppendString(tag(nil,
			fieldUpdateJSON, protowire.BytesType), "{}"), fieldUpdateSeq, protowire.VarintType), 3), fieldUpdateSessionID, protowire.BytesType), "s-1"),
		"repeated: last wins": protowire.AppendVarint(tag(append(slices.Clone(chunk), valid(&busv1.SessionUpdate{SessionId: "s-1", Json: `{"b":2}`})...),
			fieldUpdateSeq, protowire.VarintType), 9),
		"unknown field":            protowire.AppendString(tag(slices.Clone(chunk), 42, protowire.BytesType), "later"),
		"unknown fixed32":          protowire.AppendFixed32(tag(slices.Clone(chunk), 43, protowire.Fixed32Type), 1),
		"known number, wrong type": protowire.AppendVarint(tag(slices.Clone(chunk), fieldUpdateJSON, protowire.VarintType), 5),
		"truncated":                chunk[:len(chunk)-3],
		"truncated tag":            append(slices.Clone(chunk), 0x80),
		"json not UTF-8":           protowire.AppendBytes(tag(slices.Clone(chunk), fieldUpdateJSON, protowire.BytesType), []byte("{\"a\":\"\xff\"}")),
		"connection not UTF-8":     protowire.AppendBytes(tag(slices.Clone(chunk), fieldUpdateConnectionID, protowire.BytesType), []byte{0xff}),
		"a turn's first":           valid(&busv1.SessionUpdate{SessionId: "s-1", Seq: 4, Json: "{}", TurnStartedBy: "c-9"}),
		"made at":                  valid(&busv1.SessionUpdate{SessionId: "s-1", Seq: 4, Json: "{}", MadeUnixMicros: 1796000000123456}),
		"made at, wrong type":      protowire.AppendFixed64(tag(slices.Clone(chunk), fieldUpdateMade, protowire.Fixed64Type), 5),
		"starter not UTF-8":        protowire.AppendBytes(tag(slices.Clone(chunk), fieldUpdateTurnStartedBy, protowire.BytesType), []byte{0xff}),
		"session not UTF-8":        protowire.AppendBytes(tag(nil, fieldUpdateSessionID, protowire.BytesType), []byte{0xff}),
	} {
		checkDecodeAsProto(t, name, data, "s-1")
	}
}

func checkDecodeAsProto(t *testing.T, name string, data []byte, id string) {
	t.Helper()
	want := &busv1.SessionUpdate{}
	wantErr := proto.Unmarshal(data, want)
	if wantErr == nil && want.GetSessionId() != id {
		wantErr = errors.New("another session")
	}
	got, err := decodeSessionUpdate(data, id, 7)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%s: decoded with error %v, proto.Unmarshal and the session check %v", name, err, wantErr)
	}
	if err != nil {
		return
	}
	if got.SessionID != want.GetSessionId() || got.Incarnation != 7 || got.Type != want.GetType() || got.Seq != want.GetSeq() ||
		string(got.JSON) != want.GetJson() || got.ConnectionID != want.GetConnectionId() || got.TurnStartedBy != want.GetTurnStartedBy() ||
		got.MadeUnixMicros != want.GetMadeUnixMicros() {
		t.Fatalf("%s: decoded %+v, proto.Unmarshal %v", name, got, want)
	}
}

// FuzzDecodeSessionUpdate holds decodeSessionUpdate to proto.Unmarshal on
// any bytes (the seeds run in every go test).
func FuzzDecodeSessionUpdate(f *testing.F) {
	for _, u := range []*busv1.SessionUpdate{
		{SessionId: "s-1", Type: busv1.UpdateType_UPDATE_TYPE_TOOL_CALL, Seq: 3, Json: `{"a":1}`},
		{SessionId: "s-1", ConnectionId: "c"},
		{SessionId: "s-1", Seq: 2, Json: "{}", MadeUnixMicros: 1796000000123456},
	} {
		b, _ := proto.Marshal(u)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x03, 's', '-', '1', 0x22, 0x01, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) { checkDecodeAsProto(t, "fuzz", data, "s-1") })
}

// The tests' NATS server bounds a message as the stack's does.
func TestTestServersTakeTheStacksBound(t *testing.T) {
	if testenv.NATSMaxPayload != MaxPayload {
		t.Fatalf("testenv.NATSMaxPayload %d, bus.MaxPayload %d", testenv.NATSMaxPayload, MaxPayload)
	}
}

// A turn's start goes out as proto.Marshal encodes it, connection and
// all, and leaves the publisher's first update with a seq marked
// renumbered. That update names the turn's connection too
// (turn_started_by: a gateway that missed the start learns it there),
// and the next does not.
func TestPublishTurnStarted(t *testing.T) {
	nc := connect(t)
	pub, err := NewSessionUpdatePublisher(nc, "s-abc", 3)
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(pub.subject, msgs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := pub.PublishTurnStarted("conn-1"); err != nil {
		t.Fatal(err)
	}
	for seq := int64(7); seq <= 8; seq++ {
		if err := pub.Publish(busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, seq, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []*busv1.SessionUpdate{
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_TURN_STARTED, ConnectionId: "conn-1"},
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: 7, Json: "{}", Renumbered: true, TurnStartedBy: "conn-1"},
		{SessionId: "s-abc", Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: 8, Json: "{}"},
	} {
		select {
		case m := <-msgs:
			// An update with a seq carries the publisher's clock, whatever
			// it read: the bytes are proto.Marshal's for that value.
			var sent busv1.SessionUpdate
			if err := proto.Unmarshal(m.Data, &sent); err != nil {
				t.Fatal(err)
			}
			if made := sent.GetMadeUnixMicros(); (made != 0) != (u.Seq != 0) {
				t.Fatalf("%v published made_unix_micros %d", u, made)
			}
			u.MadeUnixMicros = sent.GetMadeUnixMicros()
			want, err := proto.Marshal(u)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.Data, want) {
				t.Fatalf("published %x, want %v: %x", m.Data, u, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%v not published", u)
		}
	}
}
