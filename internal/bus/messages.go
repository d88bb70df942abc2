package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/natsutil"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// PublishConfigChanged announces a committed config revision without its
// history id (as a config service that predates it did).
func PublishConfigChanged(nc *nats.Conn, revision int64, props []string) error {
	return PublishConfigRevision(nc, "", "", "", revision, props)
}

// PublishConfigRevision announces a committed config revision of the
// history identified by history, whose stored document has digest, staged
// on the revision whose digest is parent ("" when unknown).
func PublishConfigRevision(nc *nats.Conn, history, digest, parent string, revision int64, props []string) error {
	return publish(nc, SubjectConfigChanged, &busv1.ConfigChanged{Revision: revision, Props: props, History: history, Digest: digest, ParentDigest: parent})
}

// SubscribeConfigChanged calls fn with each config change announced.
// Undecodable messages are reported to bad and dropped.
func SubscribeConfigChanged(nc *nats.Conn, fn func(*busv1.ConfigChanged), bad func(error)) (*nats.Subscription, error) {
	return subscribe(nc, SubjectConfigChanged, func() *busv1.ConfigChanged { return &busv1.ConfigChanged{} }, fn, bad)
}

// SubscribeSessionUpdates follows one session's updates on subject, which
// must be a session update subject (the one the session service returned
// at attach). Updates claiming another session are dropped as bad.
func SubscribeSessionUpdates(nc *nats.Conn, subject string, fn func(Update), bad func(error)) (*nats.Subscription, error) {
	id, incarnation, err := SessionOfSubject(subject)
	if err != nil {
		return nil, fmt.Errorf("%w: %q is not a session update subject", err, subject)
	}
	return subscribeDecoded(nc, subject, func(_ string, data []byte) (Update, error) {
		return decodeSessionUpdate(data, id, incarnation)
	}, fn, bad)
}

// Update is a busv1.SessionUpdate as a subscriber receives it (to one
// session, the gateway; to all, the durable bridge). It is decoded from
// the delivered message by hand, not into a new busv1.SessionUpdate:
// JSON is a slice of the message's own bytes (nats.go copies each
// message for its delivery, so the slice is the update's alone) and
// SessionID the subscription's own string, or a slice of the subject it
// came on, checked against the message's. A streamed chunk's update
// then costs the subscriber no copy of its params and no allocation of
// its own. Nothing may modify an Update's JSON.
type Update struct {
	SessionID string
	// Incarnation is the one the update's subject names: a session
	// deleted and made again under its id has another (a late update of
	// the deleted one is told from the new one's by it).
	Incarnation  int64
	Type         busv1.UpdateType
	Seq          int64
	JSON         []byte
	ConnectionID string
	// Renumbered: the first update of its publisher, whose seq follows
	// the stored bound rather than the update before it (no gap before
	// it means anything lost).
	Renumbered bool
	// TurnStartedBy, on a turn's first update with a seq, is the
	// connection whose prompt started the turn (turn_started_by).
	TurnStartedBy string
	// MadeUnixMicros is the publisher's clock when it published the
	// update (made_unix_micros), 0 when it did not say.
	MadeUnixMicros int64
}

// decodeSessionUpdate decodes a busv1.SessionUpdate of session id, of
// the incarnation its subject named, as proto.Unmarshal would (the last
// of a repeated field wins, a field of another wire type than its own or
// of an unknown number is skipped, strings must be valid UTF-8) and
// refuses one of another session.
func decodeSessionUpdate(data []byte, id string, incarnation int64) (Update, error) {
	u := Update{SessionID: id, Incarnation: incarnation}
	var session []byte
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return Update{}, protowire.ParseError(n)
		}
		data = data[n:]
		switch {
		case num == fieldUpdateSessionID && typ == protowire.BytesType:
			session, n = protowire.ConsumeBytes(data)
		case num == fieldUpdateType && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(data)
			u.Type = busv1.UpdateType(int32(v))
		case num == fieldUpdateSeq && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(data)
			u.Seq = int64(v)
		case num == fieldUpdateJSON && typ == protowire.BytesType:
			u.JSON, n = protowire.ConsumeBytes(data)
			if n >= 0 && !utf8.Valid(u.JSON) {
				return Update{}, errors.New("json: invalid UTF-8")
			}
		case num == fieldUpdateRenumbered && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(data)
			u.Renumbered = v != 0
		case num == fieldUpdateConnectionID && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(data)
			if n >= 0 && !utf8.Valid(v) {
				return Update{}, errors.New("connection_id: invalid UTF-8")
			}
			u.ConnectionID = string(v)
		case num == fieldUpdateTurnStartedBy && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(data)
			if n >= 0 && !utf8.Valid(v) {
				return Update{}, errors.New("turn_started_by: invalid UTF-8")
			}
			u.TurnStartedBy = string(v)
		case num == fieldUpdateMade && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(data)
			u.MadeUnixMicros = int64(v)
		default:
			n = protowire.ConsumeFieldValue(num, typ, data)
		}
		if n < 0 {
			return Update{}, protowire.ParseError(n)
		}
		data = data[n:]
	}
	if string(session) != id {
		return Update{}, fmt.Errorf("update of session %q on the subject of %q", session, id)
	}
	return u, nil
}

// SubscribeAllSessionUpdates follows every session's updates (the durable
// bridge watches them all), decoded as SubscribeSessionUpdates decodes
// one session's: each update's session is its subject's, and an update
// claiming another session, or on a subject that names none, is dropped
// as bad.
func SubscribeAllSessionUpdates(nc *nats.Conn, fn func(Update), bad func(error)) (*nats.Subscription, error) {
	return subscribeDecoded(nc, SubjectAllSessionUpdates, func(subject string, data []byte) (Update, error) {
		id, incarnation, err := SessionOfSubject(subject)
		if err != nil {
			return Update{}, err
		}
		return decodeSessionUpdate(data, id, incarnation)
	}, fn, bad)
}

// PublishRestart tells watchers the launcher restarted a process.
func PublishRestart(nc *nats.Conn, process string, count int) error {
	return publish(nc, SubjectRestarts, &busv1.ProcessRestarted{Process: process, RestartCount: int32(count)})
}

// SubscribeRestarts calls fn with each restart notice.
func SubscribeRestarts(nc *nats.Conn, fn func(*busv1.ProcessRestarted), bad func(error)) (*nats.Subscription, error) {
	return subscribe(nc, SubjectRestarts, func() *busv1.ProcessRestarted { return &busv1.ProcessRestarted{} }, fn, bad)
}

func publish(nc *nats.Conn, subject string, m proto.Message) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("bus: encode %s: %w", subject, err)
	}
	if err := natsutil.Publish(nc, subject, data); err != nil {
		return fmt.Errorf("bus: publish %s: %w", subject, err)
	}
	return nil
}

// subscribe calls fn with each message on subject decoded into a new
// message of alloc's.
func subscribe[M proto.Message](nc *nats.Conn, subject string, alloc func() M, fn func(M), bad func(error)) (*nats.Subscription, error) {
	return subscribeDecoded(nc, subject, func(_ string, data []byte) (M, error) {
		v := alloc()
		return v, proto.Unmarshal(data, v)
	}, fn, bad)
}

// subscribeDecoded calls fn with each message on subject (a wildcard's
// messages come on subjects of their own) that decode reads; what it
// refuses is reported to bad (when not nil) and dropped.
func subscribeDecoded[T any](nc *nats.Conn, subject string, decode func(subject string, data []byte) (T, error), fn func(T), bad func(error)) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		v, err := decode(m.Subject, m.Data)
		if err != nil {
			if bad != nil {
				bad(fmt.Errorf("%w: %s: %w", ErrDecode, subject, err))
			}
			return
		}
		fn(v)
	})
	if err != nil {
		return nil, fmt.Errorf("bus: subscribe %s: %w", subject, err)
	}
	return sub, nil
}

// AskError is an ask that got no result.
type AskError struct {
	Failure busv1.AskFailure
	// Code, Message and Data are the client's error object when Failure is
	// ASK_FAILURE_CLIENT_ERROR, else the gateway's description.
	Code    int64
	Message string
	Data    json.RawMessage
}

func (e *AskError) Error() string {
	if e.Failure == busv1.AskFailure_ASK_FAILURE_CLIENT_ERROR {
		return fmt.Sprintf("client error %d: %s", e.Code, e.Message)
	}
	return "ask failed: " + e.Message
}

// ErrNoConnection: no gateway holds the connection any more.
var ErrNoConnection = errors.New("bus: ask: connection not found")

// Ask sends method with params to the client behind connID, through the
// gateway that holds it, and waits for its answer at most timeout. The
// answer is the client's JSON result ("null" for an explicit null), or an
// *AskError.
func Ask(ctx context.Context, nc *nats.Conn, connID, method string, params any, timeout time.Duration) (json.RawMessage, error) {
	subject, err := AskSubject(connID)
	if err != nil {
		return nil, err
	}
	req := &busv1.AskRequest{Method: method, TimeoutMs: timeout.Milliseconds()}
	if params != nil {
		raw, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("bus: ask params: %w", err)
		}
		req.ParamsJson = string(raw)
	}
	data, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("bus: encode ask: %w", err)
	}
	// The wait covers the client's time plus the relay.
	ctx, cancel := context.WithTimeout(ctx, timeout+2*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subject, data)
	natsutil.WriteFailed(nc, err)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, ErrNoConnection
	}
	if err != nil {
		return nil, fmt.Errorf("bus: ask %s: %w", method, err)
	}
	var rep busv1.AskReply
	if err := proto.Unmarshal(msg.Data, &rep); err != nil {
		return nil, fmt.Errorf("%w: ask reply: %w", ErrDecode, err)
	}
	if e := rep.GetError(); e != nil {
		return nil, &AskError{Failure: e.GetFailure(), Code: e.GetCode(), Message: e.GetMessage(), Data: json.RawMessage(e.GetDataJson())}
	}
	return json.RawMessage(rep.GetResultJson()), nil
}

// ServeAsks answers the asks for connection connID with fn, each on its
// own goroutine (fn waits for a client), until the subscription is
// removed. spawn starts those goroutines, so the caller owns and awaits
// them.
func ServeAsks(nc *nats.Conn, connID string, spawn func(func()), fn func(*busv1.AskRequest) *busv1.AskReply) (*nats.Subscription, error) {
	subject, err := AskSubject(connID)
	if err != nil {
		return nil, err
	}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		spawn(func() {
			req := &busv1.AskRequest{}
			var rep *busv1.AskReply
			if err := proto.Unmarshal(m.Data, req); err != nil || req.GetMethod() == "" {
				rep = &busv1.AskReply{Error: &busv1.AskError{Failure: busv1.AskFailure_ASK_FAILURE_INVALID, Message: "ask: a method is required"}}
			} else {
				rep = fn(req)
			}
			data, err := proto.Marshal(rep)
			if err != nil {
				data, _ = proto.Marshal(&busv1.AskReply{Error: &busv1.AskError{Failure: busv1.AskFailure_ASK_FAILURE_INVALID, Message: "ask: reply not encodable"}})
			}
			if err := m.Respond(data); err != nil {
				natsutil.WriteFailed(nc, err)
			}
		})
	})
	if err != nil {
		return nil, fmt.Errorf("bus: subscribe asks: %w", err)
	}
	// The subscription reaches the server before the caller answers the
	// client's initialize: without the flush, an ask sent right after
	// (the connection's id known from that answer) could find no
	// responder and be refused ErrNoConnection (seen once in CI).
	if err := nc.FlushTimeout(askFlushWait); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("bus: subscribe asks: %w", err)
	}
	return sub, nil
}

// askFlushWait bounds ServeAsks' wait for the server to have its
// subscription.
const askFlushWait = 2 * time.Second

// SessionUpdatePublisher publishes the updates of one session on its
// subject, built and checked once. Each update is encoded into a buffer
// the publisher keeps (nats.go copies what it publishes), so a streaming
// turn's chunk costs no allocation here. It is not safe for concurrent
// use: the caller serializes its publishes, as it must anyway to keep
// their seq order.
type SessionUpdatePublisher struct {
	nc        *nats.Conn
	sessionID string
	subject   string
	buf       []byte
	published bool // an update went out: the next are not renumbered
	// startedBy is the connection the last PublishTurnStarted named,
	// until an update with a seq carried it (turn_started_by).
	startedBy string
}

// NewSessionUpdatePublisher returns the publisher of the updates of
// sessionID's incarnation.
func NewSessionUpdatePublisher(nc *nats.Conn, sessionID string, incarnation int64) (*SessionUpdatePublisher, error) {
	subject, err := SessionUpdateSubject(sessionID, incarnation)
	if err != nil {
		return nil, err
	}
	return &SessionUpdatePublisher{nc: nc, sessionID: sessionID, subject: subject}, nil
}

// maxKeptUpdateBuffer bounds the buffer a publisher keeps between updates:
// a large one (a long tool output) is not held for the session's life.
const maxKeptUpdateBuffer = 4 << 10

// Publish publishes the update {session_id, typ, seq, json} of the
// publisher's session, to every attached connection; params is the
// session/update params object, not retained. The bytes are those
// proto.Marshal gives for the same busv1.SessionUpdate.
func (p *SessionUpdatePublisher) Publish(typ busv1.UpdateType, seq int64, params []byte) error {
	// The json field is a proto string: proto.Marshal refuses invalid
	// UTF-8, and so does this (every receiver would drop it).
	if !utf8.Valid(params) {
		return fmt.Errorf("publish %s: %w: params are not valid UTF-8", p.subject, ErrEncode)
	}
	b := appendSessionUpdate(p.buf[:0], p.sessionID, typ, seq, params, !p.published)
	if seq != 0 && p.startedBy != "" {
		b = protowire.AppendTag(b, fieldUpdateTurnStartedBy, protowire.BytesType)
		b = protowire.AppendString(b, p.startedBy)
	}
	if seq != 0 {
		b = protowire.AppendTag(b, fieldUpdateMade, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(time.Now().UnixMicro()))
	}
	err := natsutil.Publish(p.nc, p.subject, b)
	if cap(b) <= maxKeptUpdateBuffer {
		p.buf = b
	}
	if err != nil {
		return fmt.Errorf("bus: publish %s: %w", p.subject, err)
	}
	p.published = true
	if seq != 0 {
		p.startedBy = ""
	}
	return nil
}

// PublishTurnStarted publishes the UPDATE_TYPE_TURN_STARTED of a turn
// of the publisher's session that connection connID started ("" for
// none): no seq, no params, delivered to no client. It does not count as
// the publisher's first update: the first with a seq is still marked
// renumbered. That first update with a seq names connID too
// (turn_started_by), published or not here: a gateway that misses this
// announcement learns it there.
func (p *SessionUpdatePublisher) PublishTurnStarted(connID string) error {
	p.startedBy = connID
	b := appendSessionUpdate(p.buf[:0], p.sessionID, busv1.UpdateType_UPDATE_TYPE_TURN_STARTED, 0, nil, false)
	if connID != "" {
		b = protowire.AppendTag(b, fieldUpdateConnectionID, protowire.BytesType)
		b = protowire.AppendString(b, connID)
	}
	err := natsutil.Publish(p.nc, p.subject, b)
	if cap(b) <= maxKeptUpdateBuffer {
		p.buf = b
	}
	if err != nil {
		return fmt.Errorf("bus: publish %s: %w", p.subject, err)
	}
	return nil
}

// Field numbers of busv1.SessionUpdate.
const (
	fieldUpdateSessionID     protowire.Number = 1
	fieldUpdateType          protowire.Number = 2
	fieldUpdateSeq           protowire.Number = 3
	fieldUpdateJSON          protowire.Number = 4
	fieldUpdateConnectionID  protowire.Number = 5
	fieldUpdateRenumbered    protowire.Number = 6
	fieldUpdateTurnStartedBy protowire.Number = 7
	fieldUpdateMade          protowire.Number = 8
)

// appendSessionUpdate appends the wire form of a busv1.SessionUpdate
// without connection_id: fields in number order, zero values omitted, as
// proto.Marshal writes them.
func appendSessionUpdate(b []byte, sessionID string, typ busv1.UpdateType, seq int64, params []byte, renumbered bool) []byte {
	if sessionID != "" {
		b = protowire.AppendTag(b, fieldUpdateSessionID, protowire.BytesType)
		b = protowire.AppendString(b, sessionID)
	}
	if typ != 0 {
		b = protowire.AppendTag(b, fieldUpdateType, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(typ))
	}
	if seq != 0 {
		b = protowire.AppendTag(b, fieldUpdateSeq, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(seq))
	}
	if len(params) > 0 {
		b = protowire.AppendTag(b, fieldUpdateJSON, protowire.BytesType)
		b = protowire.AppendBytes(b, params)
	}
	if renumbered {
		b = protowire.AppendTag(b, fieldUpdateRenumbered, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	return b
}

// EncodeSessionUpdate is the wire form of a busv1.SessionUpdate of
// sessionID as Publish writes it, for an update sent again rather than
// published (the session service's Resend): turnStartedBy names the
// connection whose prompt started the update's turn ("" for none).
func EncodeSessionUpdate(sessionID string, typ busv1.UpdateType, seq int64, params []byte, turnStartedBy string) []byte {
	b := appendSessionUpdate(nil, sessionID, typ, seq, params, false)
	if turnStartedBy != "" {
		b = protowire.AppendTag(b, fieldUpdateTurnStartedBy, protowire.BytesType)
		b = protowire.AppendString(b, turnStartedBy)
	}
	return b
}

// DecodeSessionUpdate decodes an update of session id's incarnation as a
// subscription does (EncodeSessionUpdate's, sent again), refusing one of
// another session.
func DecodeSessionUpdate(data []byte, id string, incarnation int64) (Update, error) {
	return decodeSessionUpdate(data, id, incarnation)
}
