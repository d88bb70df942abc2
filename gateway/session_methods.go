package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// sessionRef reads session_id, or its alias sessionId (SPEC §1).
type sessionRef struct {
	SessionID      string `json:"session_id"`
	SessionIDCamel string `json:"sessionId"`
}

func (r sessionRef) id() (string, error) {
	id := r.SessionID
	if id == "" {
		id = r.SessionIDCamel
	}
	if id == "" {
		return "", invalidParams("`session_id` is required")
	}
	return id, nil
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
	resp, err := g.session.NewSession(ctx, &sessionv1.NewSessionRequest{
		Principal: cs.principalOf(), AgentAlias: alias, Cwd: p.CWD,
		SessionId: firstNonEmpty(p.SessionID, p.SessionIDCamel), InteractionSurface: p.InteractionSurface, ConnectionId: cs.id,
	})
	if err != nil {
		return nil, serviceError("session", err)
	}
	if _, err := g.hub.attach(cs, resp.GetSessionId()); err != nil {
		return nil, serviceError("gateway", err)
	}
	return map[string]any{
		"session_id":    resp.GetSessionId(),
		"agent_alias":   resp.GetAgentAlias(),
		"message_count": resp.GetMessageCount(),
		"workspace_dir": resp.GetWorkspaceDir(),
	}, nil
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
// turn_complete to be written first.
const turnCompleteWait = 5 * time.Second

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
		if err := json.Unmarshal(p.AttachRaw, &files); err != nil {
			return nil, invalidParams("`attachments` must be an array of file entries")
		}
		for _, f := range files {
			attachments = append(attachments, &sessionv1.FileRef{RefId: f.RefID, Marker: f.Marker, WorkspacePath: f.WorkspacePath})
		}
	}
	// Subscribe before the turn starts, so its first chunk is not missed.
	already, err := g.hub.attach(cs, id)
	if err != nil {
		return nil, serviceError("gateway", err)
	}
	resp, err := g.session.Prompt(ctx, &sessionv1.PromptRequest{
		Principal: cs.principalOf(), SessionId: id, Prompt: text, ClientTurnGeneration: gen,
		Attachments: attachments, ConnectionId: cs.id, Elicitation: cs.canElicit(),
	})
	if err != nil {
		if !already {
			g.hub.detach(cs, id)
		}
		return nil, serviceError("session", err)
	}
	if turn := resp.GetTurnId(); turn != "" {
		select {
		case <-cs.outbox.turnDone(turn):
		case <-time.After(turnCompleteWait):
			g.log.Warn("turn_complete not seen before the prompt's response", zap.String("conn", cs.id), zap.String("turn_id", turn))
		case <-ctx.Done():
		}
		cs.outbox.forgetTurn(turn)
	}
	return map[string]any{
		"session_id":  resp.GetSessionId(),
		"outcome":     resp.GetOutcome(),
		"stop_reason": resp.GetStopReason(),
		"content":     resp.GetContent(),
	}, nil
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
	req := firstNonEmpty(p.RequestID, p.RequestIDCamel)
	if req == "" {
		return nil, invalidParams("`request_id` is required")
	}
	switch p.Decision {
	case "allow_once", "allow_always", "reject", "reject_with_edit":
	default:
		return nil, invalidParams("`decision` must be one of allow_once, allow_always, reject, reject_with_edit")
	}
	resp, err := g.session.Approve(ctx, &sessionv1.ApproveRequest{
		Principal: cs.principalOf(), SessionId: id, RequestId: req, Decision: p.Decision, Replacement: p.Replacement, Surface: "rpc",
	})
	if err != nil {
		return nil, serviceError("session", err)
	}
	out := map[string]any{"session_id": resp.GetSessionId(), "request_id": resp.GetRequestId(), "acknowledged": resp.GetAcknowledged()}
	if resp.GetAlreadyDecided() {
		out["already_decided"] = true
	}
	return out, nil
}

func (g *Gateway) sessionState(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	id, err := decodeSessionID(params)
	if err != nil {
		return nil, err
	}
	resp, err := g.session.State(ctx, &sessionv1.StateRequest{Principal: cs.principalOf(), SessionId: id})
	if err != nil {
		return nil, serviceError("session", err)
	}
	out := map[string]any{"session_id": resp.GetSessionId(), "state": resp.GetState()}
	if resp.GetTurnId() != "" {
		out["turn_id"] = resp.GetTurnId()
	}
	return out, nil
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
			"session_id": s.GetSessionId(), "agent_alias": s.GetAgentAlias(), "state": s.GetState(),
			"message_count": s.GetMessageCount(), "workspace_dir": s.GetWorkspaceDir(), "title": s.GetTitle(),
			"created_at": s.GetCreatedAt(), "updated_at": s.GetUpdatedAt(),
		})
	}
	return map[string]any{"sessions": list}, nil
}

// lifecycle builds session/close, session/kill and session/delete: the
// result names the done-word (closed, killed, deleted).
func lifecycle(word string, call func(sessionv1.SessionServiceClient, context.Context, *sessionv1.LifecycleRequest, ...grpc.CallOption) (*sessionv1.LifecycleResponse, error)) func(*Gateway, context.Context, *connState, json.RawMessage) (any, error) {
	return func(g *Gateway, ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
		id, err := decodeSessionID(params)
		if err != nil {
			return nil, err
		}
		resp, err := call(g.session, ctx, &sessionv1.LifecycleRequest{Principal: cs.principalOf(), SessionId: id})
		if err != nil {
			return nil, serviceError("session", err)
		}
		return map[string]any{"session_id": resp.GetSessionId(), word: resp.GetDone()}, nil
	}
}

func decodeSessionID(params json.RawMessage) (string, error) {
	var p sessionRef
	if err := decodeParams(params, &p); err != nil {
		return "", err
	}
	return p.id()
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
