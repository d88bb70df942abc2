package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/uploads"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// sessionRef reads session_id, or its alias sessionId (docs/spec.md §1).
type sessionRef struct {
	SessionID      string `json:"session_id"`
	SessionIDCamel string `json:"sessionId"`
}

// id is the session id, checked against its format before it reaches any
// service or the bus.
func (r sessionRef) id() (string, error) {
	id := r.SessionID
	if id == "" {
		id = r.SessionIDCamel
	}
	if err := ids.Check(id); err != nil {
		return "", invalidParams("`session_id` " + err.Error())
	}
	return id, nil
}

// optionalID is the session id when one was sent.
func (r sessionRef) optionalID() (string, error) {
	if r.SessionID == "" && r.SessionIDCamel == "" {
		return "", nil
	}
	return r.id()
}

func (g *Gateway) sessionNew(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p struct {
		sessionRef
		AgentAlias         string `json:"agent_alias"`
		AgentAliasCamel    string `json:"agentAlias"`
		CWD                string `json:"cwd"`
		InteractionSurface string `json:"interaction_surface"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	alias := p.AgentAlias
	if alias == "" {
		alias = p.AgentAliasCamel
	}
	if alias == "" {
		alias = "default"
	}
	id, err := p.optionalID()
	if err != nil {
		return nil, err
	}
	if err := g.hub.busDown(); err != nil {
		return nil, serviceError("gateway", err)
	}
	if !g.hub.reserve(cs) {
		return nil, serviceError("gateway", errFollowLimit())
	}
	defer g.hub.unreserve(cs)
	resp, err := g.session.NewSession(ctx, &sessionv1.NewSessionRequest{
		Principal: cs.principalOf(), AgentAlias: alias, Cwd: p.CWD,
		SessionId: id, InteractionSurface: p.InteractionSurface, ConnectionId: cs.id,
		ConfigRevision: cs.configRev.Load(),
	})
	if err != nil {
		return nil, serviceError("session", err)
	}
	if _, _, err := g.hub.attach(cs, resp.GetSessionId(), resp.GetUpdateSubject(), seqOr(resp.UpdateSeq), true, true); err != nil {
		if resp.GetCreated() && !errors.Is(err, errReplaced) {
			g.unmake(ctx, cs, resp.GetSessionId(), err)
		}
		return nil, attachError(resp.GetSessionId(), err)
	}
	return map[string]any{
		"session_id":    resp.GetSessionId(),
		"agent_alias":   resp.GetAgentAlias(),
		"message_count": resp.GetMessageCount(),
		"workspace_dir": resp.GetWorkspaceDir(),
	}, nil
}

// unmake deletes the session a session/new made and then could not
// follow (err): the call fails, and its session goes with it. Left, it
// stayed open with its id told to no client and followed by none (the
// bus server stopped is seen only after two missed pings, some 14 s in
// which busDown lets session/new through), one more at each retry,
// each counted against the principal's open and kept sessions. Deleted
// rather than closed, as a closed one stays kept: made a moment ago, it
// holds nothing yet. A session the call resumed was there before it and
// is left as it is; so is one errReplaced names, whose id names another
// session now.
func (g *Gateway) unmake(ctx context.Context, cs *connState, sessionID string, err error) {
	// The call's own deadline may be spent waiting for the bus.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, derr := g.session.Delete(ctx, &sessionv1.DeleteRequest{Principal: cs.principalOf(), SessionId: sessionID}); derr != nil {
		g.log.Warn("session made by a session/new that could not follow it not deleted", zap.String("conn", cs.id),
			zap.String("session_id", sessionID), zap.NamedError("follow_error", err), zap.Error(derr))
		return
	}
	g.log.Info("session made by a session/new that could not follow it deleted", zap.String("conn", cs.id),
		zap.String("session_id", sessionID), zap.Error(err))
}

// promptText reads a prompt given as a string or as ACP content blocks
// ([{type:"text", text}]).
func promptText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", invalidParams("`prompt` is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := checkStructs(raw, "prompt", 2); err != nil {
		return "", err
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", invalidParams("`prompt` must be a string or an array of text blocks")
	}
	var parts []string
	for _, b := range blocks {
		if b.Type == "text" || b.Type == "" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n"), nil
}

// turnCompleteWait bounds how long a prompt's response waits for its own
// turn_complete while nothing moves on the connection: no update written
// to it, none queued or being written. A turn_complete lost on the bus
// must not hold the response for ever; one behind a stream still being
// written (a loaded machine, a client reading slowly within the
// write-stall rule) keeps it waiting, since the response comes after its
// turn_complete (docs/spec.md §5). A fixed bound let the response of a
// 20,000-update turn overtake 3,104 of its updates on a loaded machine.
const turnCompleteWait = 5 * time.Second

// awaitTurnComplete returns once turn's turn_complete was written to cs,
// cs is gone or ctx ends, or after g.turnWait in which nothing moved on
// cs (see turnCompleteWait); it reports false only in the last case.
func (g *Gateway) awaitTurnComplete(ctx context.Context, cs *connState, turn string) (seen bool) {
	wait := g.turnWait
	if wait <= 0 {
		wait = turnCompleteWait
	}
	done := cs.outbox.turnDone(turn)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	last, _ := cs.outbox.progress()
	for {
		select {
		case <-done:
			return true
		case <-ctx.Done():
			return true
		case <-timer.C:
		}
		written, pending := cs.outbox.progress()
		if written == last && !pending {
			g.log.Warn("turn_complete not seen before the prompt's response", zap.String("conn", cs.id), zap.String("turn_id", turn),
				zap.Duration("idle", wait))
			return false
		}
		last = written
		timer.Reset(wait)
	}
}

func (g *Gateway) sessionPrompt(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p struct {
		sessionRef
		Prompt    json.RawMessage `json:"prompt"`
		Gen       *int64          `json:"client_turn_generation"`
		GenCamel  *int64          `json:"clientTurnGeneration"`
		AttachRaw json.RawMessage `json:"attachments"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	id, err := p.id()
	if err != nil {
		return nil, err
	}
	text, err := promptText(p.Prompt)
	if err != nil {
		return nil, err
	}
	gen := p.Gen
	if gen == nil {
		gen = p.GenCamel
	}
	var attachments []*sessionv1.FileRef
	if len(p.AttachRaw) > 0 && string(p.AttachRaw) != "null" {
		var files []struct {
			RefID         string `json:"ref_id"`
			Marker        string `json:"marker"`
			WorkspacePath string `json:"workspace_path"`
		}
		if err := checkStructs(p.AttachRaw, "attachments", 2); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(p.AttachRaw, &files); err != nil {
			return nil, invalidParams("`attachments` must be an array of file entries")
		}
		if len(files) > uploads.MaxAttachments {
			return nil, invalidParams(uploads.TooManyAttachments(len(files)))
		}
		for _, f := range files {
			attachments = append(attachments, &sessionv1.FileRef{RefId: f.RefID, Marker: f.Marker, WorkspacePath: f.WorkspacePath})
		}
	}
	if err := g.hub.busDown(); err != nil {
		return nil, serviceError("gateway", err)
	}
	req := &sessionv1.PromptRequest{
		Principal: cs.principalOf(), SessionId: id, Prompt: text, ClientTurnGeneration: gen,
		Attachments: attachments, ConnectionId: cs.id, Elicitation: cs.canElicit(),
		ConfigRevision: cs.configRev.Load(),
	}
	// A session/close or session/kill of this session on cs meanwhile
	// leaves it only once this prompt has its turn_complete (hub.leave).
	g.hub.promptBegins(cs, id)
	defer g.hub.promptEnds(cs, id)
	cs.outbox.promptBegins(id)
	defer cs.outbox.promptEnds(id)
	resp, notFound, err := g.prompt(ctx, cs, req, false)
	if notFound {
		// The session followed may have been deleted a moment ago, its id
		// naming a new one whose updates come on another subject: attach
		// again, on the subject the session service names now, once.
		resp, _, err = g.prompt(ctx, cs, req, true)
	}
	if err != nil {
		return nil, err
	}
	if turn := resp.GetTurnId(); turn != "" {
		seen := g.awaitTurnComplete(ctx, cs, turn)
		cs.outbox.forgetTurn(turn)
		// Answering the turn as ended without its turn_complete told the
		// client its stream was whole when the bus had lost its tail (a
		// bus server stopped for 20 s: turns answered "completed" with
		// 66 of 100 chunks, or none, and no turn_complete): no later
		// update need come to show the hole. The connections that follow
		// the session are closed instead, as for a gap in seq.
		if !seen && g.hub.turnLost(cs, id, turn) {
			return nil, serviceError("gateway", rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, errTurnLost.Error()))
		}
	}
	return map[string]any{
		"session_id":  resp.GetSessionId(),
		"outcome":     outcomeWords[resp.GetOutcome()],
		"stop_reason": resp.GetStopReason(),
		"content":     resp.GetContent(),
	}, nil
}

// prompt follows the session, then prompts it with the incarnation
// followed: the session service refuses the prompt as not found if the
// id names another, and notFound says it refused so. fresh asks the
// session service for the subject even when cs follows the session
// already.
func (g *Gateway) prompt(ctx context.Context, cs *connState, req *sessionv1.PromptRequest, fresh bool) (resp *sessionv1.PromptResponse, notFound bool, err error) {
	// Follow the session before the turn starts, so its first chunk is
	// not missed; only once the session service accepted this principal.
	already, incarnation, err := g.attach(ctx, cs, req.GetSessionId(), fresh)
	if err != nil {
		return nil, false, err
	}
	req.Incarnation = incarnation
	resp, err = g.session.Prompt(ctx, req)
	if err != nil {
		if !already {
			g.hub.release(cs, req.GetSessionId())
		}
		return nil, status.Code(err) == codes.NotFound, serviceError("session", err)
	}
	return resp, false, nil
}

func (g *Gateway) sessionCancel(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	id, err := decodeSessionID(params)
	if err != nil {
		return nil, err
	}
	resp, err := g.session.Cancel(ctx, &sessionv1.CancelRequest{Principal: cs.principalOf(), SessionId: id})
	if err != nil {
		return nil, serviceError("session", err)
	}
	return map[string]any{"session_id": resp.GetSessionId(), "cancelled": resp.GetCancelled()}, nil
}

func (g *Gateway) sessionApprove(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p struct {
		sessionRef
		RequestID      string `json:"request_id"`
		RequestIDCamel string `json:"requestId"`
		Decision       string `json:"decision"`
		Replacement    string `json:"replacement"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	id, err := p.id()
	if err != nil {
		return nil, err
	}
	req := p.RequestID
	if req == "" {
		req = p.RequestIDCamel
	}
	if err := ids.Check(req); err != nil {
		return nil, invalidParams("`request_id` " + err.Error())
	}
	decision, ok := decisions[p.Decision]
	if !ok {
		return nil, invalidParams("`decision` must be one of allow_once, allow_always, reject, reject_with_edit")
	}
	resp, err := g.session.Approve(ctx, &sessionv1.ApproveRequest{
		Principal: cs.principalOf(), SessionId: id, RequestId: req, Decision: decision, Replacement: p.Replacement, Surface: sessionv1.Surface_SURFACE_RPC,
	})
	if status.Code(err) == codes.DeadlineExceeded {
		// The decision may have been taken and be stored after this
		// answer: the session service stores it under its own bound.
		// Sent again, it is answered with the one that stands.
		return nil, jsonrpc.NewError(jsonrpc.CodeInternal, "session timed out on approval request `"+req+
			"`: its decision may still be recorded; send it again to learn which decision stands", nil)
	}
	if err != nil {
		return nil, serviceError("session", err)
	}
	out := map[string]any{"session_id": resp.GetSessionId(), "request_id": resp.GetRequestId(), "acknowledged": resp.GetAcknowledged()}
	if resp.GetAlreadyDecided() {
		out["already_decided"] = true
		// SPEC's result is {session_id, request_id, acknowledged}; the
		// decision that stands goes beside already_decided, in the
		// words of an approval_request sent again (docs/spec.md §5).
		if d, by := standingWords(resp); d != "" {
			out["decision"], out["decided_by"] = d, by
		}
	}
	return out, nil
}

// standingWords are the decision that stands on resp's request and who
// took it, as words; empty while the request is pending.
func standingWords(resp *sessionv1.ApproveResponse) (decision, decidedBy string) {
	switch resp.GetStatus() {
	case sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED:
		return decisionWords[resp.GetDecision()], surfaceWords[resp.GetSurface()]
	case sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT:
		return "timeout", "service"
	case sessionv1.ApprovalStatus_APPROVAL_STATUS_CANCELLED:
		return "cancelled", "service"
	}
	return "", ""
}

// sessionState is deferred (see method.later): concurrent reads of one
// session by one principal share one State call, encoded once.
func (g *Gateway) sessionState(ctx context.Context, wait laterWait, cs *connState, params json.RawMessage, reply jsonrpc.Reply) {
	id, err := decodeSessionID(params)
	if err != nil {
		reply(nil, err)
		return
	}
	p, key := cs.principalKey()
	g.stateReads.Go(ctx, stateKey{key, id}, wait.deadline, wait.owner, func(ctx context.Context) (sharedRead, error) {
		resp, err := g.session.State(ctx, &sessionv1.StateRequest{Principal: p, SessionId: id})
		if err != nil {
			return sharedRead{}, err
		}
		enc, err := json.Marshal(stateReply{SessionID: resp.GetSessionId(), State: stateWords[resp.GetState()], TurnID: resp.GetTurnId()})
		if err != nil {
			return sharedRead{}, err
		}
		return sharedRead{enc, g.readAt(resp.GetReadAt())}, nil
	}, func(r sharedRead, err error) {
		if err != nil {
			reply(nil, serviceError("session", err))
			return
		}
		reply(r.enc, nil)
	})
}

// stateKey is what makes two session/state reads the same read.
type stateKey struct{ principal, session string }

type stateReply struct {
	SessionID string `json:"session_id"`
	State     string `json:"state"`
	TurnID    string `json:"turn_id,omitempty"`
}

func (g *Gateway) sessionMessages(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p struct {
		sessionRef
		Limit       int64  `json:"limit"`
		BeforeIndex *int64 `json:"before_index"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	id, err := p.id()
	if err != nil {
		return nil, err
	}
	if p.Limit < 0 {
		return nil, invalidParams("`limit` must not be negative")
	}
	resp, err := g.session.Messages(ctx, &sessionv1.MessagesRequest{Principal: cs.principalOf(), SessionId: id, Limit: p.Limit, BeforeIndex: p.BeforeIndex})
	if err != nil {
		return nil, serviceError("session", err)
	}
	msgs := make([]map[string]any, 0, len(resp.GetMessages()))
	for _, m := range resp.GetMessages() {
		msgs = append(msgs, map[string]any{"index": m.GetIndex(), "role": m.GetRole(), "content": m.GetContent()})
	}
	return map[string]any{"session_id": resp.GetSessionId(), "messages": msgs, "total": resp.GetTotal()}, nil
}

func (g *Gateway) sessionList(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p struct {
		Limit         int64 `json:"limit"`
		IncludeClosed bool  `json:"include_closed"`
	}
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.Limit < 0 {
		return nil, invalidParams("`limit` must not be negative")
	}
	resp, err := g.session.List(ctx, &sessionv1.ListRequest{Principal: cs.principalOf(), Limit: p.Limit, IncludeClosed: p.IncludeClosed})
	if err != nil {
		return nil, serviceError("session", err)
	}
	list := make([]map[string]any, 0, len(resp.GetSessions()))
	for _, s := range resp.GetSessions() {
		list = append(list, map[string]any{
			"session_id": s.GetSessionId(), "agent_alias": s.GetAgentAlias(), "state": stateWords[s.GetState()],
			"message_count": s.GetMessageCount(), "workspace_dir": s.GetWorkspaceDir(), "title": s.GetTitle(),
			"created_at": wireTime(s.GetCreatedAt()), "updated_at": wireTime(s.GetUpdatedAt()),
		})
	}
	return map[string]any{"sessions": list}, nil
}

func (g *Gateway) sessionClose(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	id, err := decodeSessionID(params)
	if err != nil {
		return nil, err
	}
	resp, err := g.session.Close(ctx, &sessionv1.CloseRequest{Principal: cs.principalOf(), SessionId: id})
	if err != nil {
		return nil, serviceError("session", err)
	}
	// A closed session publishes nothing until it is resumed, which
	// follows it again: following it on would hold its subscription for
	// the connection's life.
	g.hub.leave(cs, id)
	return map[string]any{"session_id": resp.GetSessionId(), "closed": resp.GetClosed()}, nil
}

func (g *Gateway) sessionKill(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	id, err := decodeSessionID(params)
	if err != nil {
		return nil, err
	}
	resp, err := g.session.Kill(ctx, &sessionv1.KillRequest{Principal: cs.principalOf(), SessionId: id})
	if err != nil {
		return nil, serviceError("session", err)
	}
	g.hub.leave(cs, id)
	return map[string]any{"session_id": resp.GetSessionId(), "killed": resp.GetKilled()}, nil
}

func (g *Gateway) sessionDelete(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	id, err := decodeSessionID(params)
	if err != nil {
		return nil, err
	}
	resp, err := g.session.Delete(ctx, &sessionv1.DeleteRequest{Principal: cs.principalOf(), SessionId: id})
	if err != nil {
		return nil, serviceError("session", err)
	}
	return map[string]any{"session_id": resp.GetSessionId(), "deleted": resp.GetDeleted()}, nil
}

// attach follows a session's updates for cs once the session service has
// accepted cs's principal for it (Attach), on the subject it returned,
// and returns the incarnation followed. A connection that follows the
// session already is not asked about unless fresh.
func (g *Gateway) attach(ctx context.Context, cs *connState, sessionID string, fresh bool) (already bool, incarnation int64, err error) {
	incarnation, ok := g.hub.attached(cs, sessionID)
	if ok && !fresh {
		return true, incarnation, nil
	}
	if !ok && g.hub.full(cs) {
		return false, 0, serviceError("gateway", errFollowLimit())
	}
	resp, err := g.session.Attach(ctx, &sessionv1.AttachRequest{Principal: cs.principalOf(), SessionId: sessionID, ConnectionId: cs.id})
	if err != nil {
		return false, 0, serviceError("session", err)
	}
	already, incarnation, err = g.hub.attach(cs, sessionID, resp.GetSubject(), seqOr(resp.UpdateSeq), false, false)
	if err != nil {
		return false, 0, attachError(sessionID, err)
	}
	return already, incarnation, nil
}

// seqOr is an update_seq the session service answered, -1 when it did
// not (a service older than the field).
func seqOr(seq *int64) int64 {
	if seq == nil {
		return -1
	}
	return *seq
}

// attachError maps the hub's refusal: a session deleted (its id naming a
// new one) between the session service's answer and the attach is not
// found, as it would be a moment later; anything else is the gateway's.
func attachError(sessionID string, err error) error {
	if errors.Is(err, errNotAtServer) {
		// The bus, not the gateway, failed: said as busDown says it, not
		// "gateway failed".
		return serviceError("gateway", rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, errBusDown.Error()))
	}
	if errors.Is(err, errReplaced) {
		return serviceError("session", rpcerr.Error(codes.NotFound, rpcerr.ReasonSessionNotFound, rpcerr.NoIndex,
			fmt.Sprintf("Session %s not found", sessionID)))
	}
	return serviceError("gateway", err)
}

// wireTime is a timestamp as the socket shows it: RFC 3339 in UTC.
func wireTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

func decodeSessionID(params json.RawMessage) (string, error) {
	// The usual shape, {"session_id":"<token>"} exactly, is read as it
	// is: a token has no escapes, quotes or anything else to decode, and
	// any other shape takes the general path below.
	const head, tail = `{"session_id":"`, `"}`
	if len(params) > len(head)+len(tail) && string(params[:len(head)]) == head && string(params[len(params)-len(tail):]) == tail {
		if id := string(params[len(head) : len(params)-len(tail)]); ids.Token(id) {
			return id, nil
		}
	}
	var p sessionRef
	if err := decodeParams(params, &p); err != nil {
		return "", err
	}
	return p.id()
}
