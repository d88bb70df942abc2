package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// approvalSchema is docs/spec.md §5's requestedSchema for an approval.
var approvalSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"choice": map[string]any{
			"type": "string", "title": "Choice",
			"oneOf": []map[string]any{
				{"const": "allow_once", "title": "Allow once"},
				{"const": "allow_always", "title": "Always allow"},
				{"const": "reject", "title": "Reject"},
			},
		},
	},
	"required": []string{"choice"},
}

// elicitApproval asks the client to decide an approval_request and hands
// the decision to the session service. Whoever decides first wins there;
// a later answer from here is told it was already decided and ignored.
func (g *Gateway) elicitApproval(ctx context.Context, cs *connState, u bus.Update) {
	var ar struct {
		RequestID        string `json:"request_id"`
		ToolName         string `json:"tool_name"`
		ArgumentsSummary string `json:"arguments_summary"`
		TimeoutSecs      int64  `json:"timeout_secs"`
	}
	if err := json.Unmarshal(u.JSON, &ar); err != nil || ar.RequestID == "" {
		g.log.Warn("approval_request without request_id", zap.String("session_id", u.SessionID))
		return
	}
	timeout := time.Duration(ar.TimeoutSecs) * time.Second
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	raw, err := cs.conn.Call(ctx, "elicitation/create", map[string]any{
		"sessionId":       u.SessionID,
		"mode":            "form",
		"message":         fmt.Sprintf("Allow the tool `%s` to run? %s", ar.ToolName, ar.ArgumentsSummary),
		"requestedSchema": approvalSchema,
	})
	decision := sessionv1.Decision_DECISION_REJECT
	var rpcErr *jsonrpc.Error
	switch {
	case errors.As(err, &rpcErr):
		// An error reply is a failure of the ask, not a decision: leave it
		// to the other surfaces or the timeout.
		g.log.Info("elicitation answered with an error", zap.String("conn", cs.id), zap.Int64("code", rpcErr.Code))
		return
	case err != nil:
		return // no answer in time, or the connection is gone
	default:
		decision = elicitationDecision(raw)
	}
	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer acancel()
	resp, err := g.session.Approve(actx, &sessionv1.ApproveRequest{
		Principal: cs.principalOf(), SessionId: u.SessionID, RequestId: ar.RequestID, Decision: decision, Surface: sessionv1.Surface_SURFACE_ELICITATION,
	})
	if err != nil {
		g.log.Info("elicitation decision not taken", zap.String("conn", cs.id), zap.Error(err))
		return
	}
	if resp.GetAlreadyDecided() {
		g.log.Info("elicitation answer came after another decision", zap.String("conn", cs.id), zap.String("request_id", ar.RequestID))
	}
}

// elicitationDecision maps an elicitation reply to an approval decision:
// accept with a known choice is that choice; decline, cancel, null, an
// ambiguous reply, or anything else rejects.
func elicitationDecision(raw json.RawMessage) sessionv1.Decision {
	var r struct {
		Action  string `json:"action"`
		Content struct {
			Choice string `json:"choice"`
		} `json:"content"`
	}
	// A reply whose keys repeat under case folding ("action" and
	// "ACTION") says two things; encoding/json would take the last.
	if jsonrpc.CheckStructs(raw, 2) != nil || json.Unmarshal(raw, &r) != nil || r.Action != "accept" {
		return sessionv1.Decision_DECISION_REJECT
	}
	switch r.Content.Choice {
	case "allow_once", "allow_always", "reject":
		return decisions[r.Content.Choice]
	}
	return sessionv1.Decision_DECISION_REJECT
}

// serveAsks relays services' asks for this connection (bus.Ask) until the
// subscription is removed at disconnect.
func (g *Gateway) serveAsks(cs *connState) (*nats.Subscription, error) {
	return bus.ServeAsks(g.nats, cs.id, g.spawn, func(req *busv1.AskRequest) *busv1.AskReply {
		return g.relayAsk(cs, req)
	})
}

func (g *Gateway) relayAsk(cs *connState, req *busv1.AskRequest) *busv1.AskReply {
	if req.GetMethod() == "elicitation/create" && !cs.canElicit() {
		return &busv1.AskReply{Error: &busv1.AskError{Failure: busv1.AskFailure_ASK_FAILURE_NOT_ADVERTISED, Message: "the client did not advertise elicitation"}}
	}
	var params any
	if req.GetParamsJson() != "" {
		if !json.Valid([]byte(req.GetParamsJson())) {
			return &busv1.AskReply{Error: &busv1.AskError{Failure: busv1.AskFailure_ASK_FAILURE_INVALID, Message: "ask: params are not JSON"}}
		}
		params = json.RawMessage(req.GetParamsJson())
	}
	timeout := time.Duration(req.GetTimeoutMs()) * time.Millisecond
	if timeout <= 0 || timeout > maxAskTimeout {
		timeout = maxAskTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	raw, err := cs.conn.Call(ctx, req.GetMethod(), params)
	var rpcErr *jsonrpc.Error
	switch {
	case errors.As(err, &rpcErr):
		return &busv1.AskReply{Error: &busv1.AskError{Failure: busv1.AskFailure_ASK_FAILURE_CLIENT_ERROR,
			Code: rpcErr.Code, Message: rpcErr.Message, DataJson: string(rpcErr.Data)}}
	case err != nil:
		return &busv1.AskReply{Error: &busv1.AskError{Failure: busv1.AskFailure_ASK_FAILURE_NO_ANSWER, Message: "the client did not answer"}}
	}
	return &busv1.AskReply{ResultJson: string(raw)}
}

// maxAskTimeout bounds how long an ask may hold a connection's pending
// call.
const maxAskTimeout = 10 * time.Minute
