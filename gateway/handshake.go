package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/version"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

type initializeParams struct {
	ProtocolVersion      json.RawMessage `json:"protocol_version"`
	ProtocolVersionCamel json.RawMessage `json:"protocolVersion"`
	ClientCapabilities   json.RawMessage `json:"client_capabilities"`
	ClientCapsCamel      json.RawMessage `json:"clientCapabilities"`
	AuthToken            string          `json:"auth_token"`
	TUIID                string          `json:"tui_id"`
}

type clientCapabilities struct {
	Elicitation json.RawMessage `json:"elicitation"`
}

// initialize binds the connection's principal (docs/spec.md §4). A version
// mismatch or an unpaired token binds nothing, and the client may try
// again; a later successful initialize replaces the binding.
func (g *Gateway) initialize(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p initializeParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	v, field := p.ProtocolVersion, "protocol_version"
	if isAbsent(v) {
		v, field = p.ProtocolVersionCamel, "protocolVersion"
	}
	if isAbsent(v) {
		return nil, invalidParams("`protocol_version` is required")
	}
	// Read as written: a json.Number would take "1" as 1 and answer "abc"
	// in the decoder's words, and 1.0 is not a version a client sends.
	if !isIntegerLiteral(v) {
		return nil, invalidParams(fmt.Sprintf("`%s` must be an integer", field))
	}
	if n, err := strconv.ParseInt(string(v), 10, 64); err != nil || n != version.Protocol {
		return nil, jsonrpc.NewError(jsonrpc.CodeVersionMismatch,
			fmt.Sprintf("Protocol version mismatch: server=%d, client=%s", version.Protocol, v), nil)
	}
	caps, capsField := p.ClientCapabilities, "client_capabilities"
	if len(caps) == 0 {
		caps, capsField = p.ClientCapsCamel, "clientCapabilities"
	}
	var cc clientCapabilities
	if len(caps) > 0 && caps[0] == '{' {
		if err := checkStructs(caps, capsField, 1); err != nil {
			return nil, err
		}
		if err := json.Unmarshal(caps, &cc); err != nil {
			return nil, invalidParams("`client_capabilities` must be an object")
		}
	}
	resp, err := g.config.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{
		PeerUid: cs.peer.UID, PeerPid: cs.peer.PID, AuthToken: p.AuthToken,
	})
	if err != nil {
		werr := serviceError("config", err)
		if werr.Code == jsonrpc.CodeAuthRequired {
			g.log.Info("initialize refused", zap.String("conn", cs.id), zap.Int32("peer_pid", cs.peer.PID), zap.Int32("peer_uid", cs.peer.UID), zap.String("reason", werr.Message))
		}
		return nil, werr
	}
	principal := resp.GetPrincipal()
	// Past the initialize deadline the connection is closing: bind
	// nothing to it.
	if !cs.conn.MarkInitialized() {
		return nil, jsonrpc.NewError(jsonrpc.CodeAuthRequired, "Initialize deadline passed", nil)
	}
	// A re-initialize may bind another principal: what the previous one
	// followed is dropped, and attaching again asks the session service.
	if prev := cs.principalOf(); prev != nil && prev.GetPrincipalId() != principal.GetPrincipalId() {
		g.hub.detach(cs, "")
	}
	cs.bind(principal, isElicitation(cc.Elicitation), p.TUIID)
	cs.mu.Lock()
	if cs.askSub == nil {
		if cs.askSub, err = g.serveAsks(cs); err != nil {
			g.log.Warn("asks for this connection unavailable", zap.String("conn", cs.id), zap.Error(err))
		}
	}
	cs.mu.Unlock()
	g.log.Info("connection initialized", zap.String("conn", cs.id),
		zap.Int32("peer_pid", cs.peer.PID), zap.Int32("peer_uid", cs.peer.UID),
		zap.String("principal_id", principal.GetPrincipalId()))
	return map[string]any{
		"protocol_version": version.Protocol,
		"protocolVersion":  version.Protocol,
		"server_version":   g.version,
		"serverVersion":    g.version,
		"server_pid":       os.Getpid(),
		"capabilities":     capabilitiesFor(resp.GetPermissions()),
		"principal_id":     principal.GetPrincipalId(),
	}, nil
}

// isElicitation reads client_capabilities.elicitation: true or any object
// advertises it; absent, null or false does not.
func isElicitation(raw json.RawMessage) bool {
	switch string(raw) {
	case "", "null", "false":
		return false
	}
	return true
}

// isAbsent reports whether a field read as json.RawMessage was left out
// or sent as null.
func isAbsent(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

// isIntegerLiteral reports whether v is a JSON number without fraction or
// exponent: -?(0|[1-9][0-9]*).
func isIntegerLiteral(v []byte) bool {
	if len(v) > 0 && v[0] == '-' {
		v = v[1:]
	}
	if len(v) == 0 || len(v) > 1 && v[0] == '0' {
		return false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
