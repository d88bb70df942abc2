package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/version"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
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
	resp, withoutConfig, err := g.resolvePrincipal(ctx, cs, p.AuthToken)
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
	result := map[string]any{
		"protocol_version": version.Protocol,
		"protocolVersion":  version.Protocol,
		"server_version":   g.version,
		"serverVersion":    g.version,
		"server_pid":       os.Getpid(),
		"capabilities":     capabilitiesFor(resp.GetPermissions()),
		"principal_id":     principal.GetPrincipalId(),
	}
	if withoutConfig != "" {
		result["config_unavailable"] = withoutConfig
	}
	return result, nil
}

// resolvePrincipal asks the config service who the peer is (docs/spec.md
// §4). When the service cannot be reached (down, hung) and the peer is
// the operator as the gateway alone can tell (operatorWithoutConfig), it
// binds the operator anyway and withoutConfig says why config was not
// asked: initialize needed config, so exactly when an operator asked the
// socket what was wrong (health, status, clawmesh doctor) every call
// failed with "config unavailable" after the whole call deadline.
func (g *Gateway) resolvePrincipal(ctx context.Context, cs *connState, token string) (resp *configv1.ResolvePrincipalResponse, withoutConfig string, err error) {
	operator := g.operatorWithoutConfig(cs, token)
	if operator && g.monitor.statusOf("config") == "unreachable" {
		// The monitor found config unanswering: a short while is enough
		// for one that still answers, and the operator is not kept
		// waiting the whole deadline (the peers config alone can name
		// still wait it out, as before).
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, awayStatusWait)
		defer cancel()
	}
	resp, err = g.config.ResolvePrincipal(ctx, &configv1.ResolvePrincipalRequest{
		PeerUid: cs.peer.UID, PeerPid: cs.peer.PID, AuthToken: token,
	})
	if err == nil || !operator || !configUnreachable(err) {
		return resp, "", err
	}
	why := serviceError("config", err).Message
	g.log.Warn("config service unreachable: bound the operator by its uid alone",
		zap.String("conn", cs.id), zap.Int32("peer_pid", cs.peer.PID), zap.Int32("peer_uid", cs.peer.UID),
		zap.String("reason", why), zap.Error(err))
	return &configv1.ResolvePrincipalResponse{
		Principal: &commonv1.Principal{
			PrincipalId: configschema.OperatorPrincipal, Operator: true,
			PeerUid: cs.peer.UID, PeerPid: cs.peer.PID,
		},
		Permissions: slices.Clone(configschema.Permissions),
	}, why, nil
}

// operatorWithoutConfig reports whether the peer may be bound as the
// operator when the config service cannot be asked: a local peer that
// sent no token (a token is config's to check, with no fallback) and
// whose uid, read with SO_PEERCRED, is the gateway's own. The daemon's
// uid is the operator (§4), and every process of the stack runs as it
// (`clawmesh up`, the compose file, the Kubernetes manifests); a peer
// with the gateway's uid already holds the gateway's own authority (it
// may signal, trace or read it), so naming it the operator gives it
// nothing more. users.<name>.uid entries are config's and are not
// known here: those peers still fail.
func (g *Gateway) operatorWithoutConfig(cs *connState, token string) bool {
	return token == "" && cs.local() && cs.peer.UID != -1 && int64(uint32(cs.peer.UID)) == g.uid
}

// configUnreachable reports whether err says the config service gave no
// answer (it is down, not yet restarted, or hung past the deadline), as
// opposed to an answer: a refusal, or a failure it named.
func configUnreachable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return errors.Is(err, context.DeadlineExceeded)
	}
	if reason, _ := rpcerr.Details(st); reason != "" {
		return false
	}
	return st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
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
