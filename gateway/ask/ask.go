// Package ask lets a service ask one client connection something through
// the gateway: an outgoing JSON-RPC request (zc-out-<n>) such as
// elicitation/create, answered by the client and relayed back over NATS.
package ask

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/clawmesh/clawmesh/internal/subjects"
)

// Request is what a service sends on subjects.ConnAsk(connID).
type Request struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
	// TimeoutMS bounds the wait for the client's answer.
	TimeoutMS int64 `json:"timeout_ms"`
}

// Reply is the gateway's answer: the client's result (JSON null for an
// explicit "result": null) or an error object.
type Reply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Error is a JSON-RPC error object from the client, or one of the
// gateway's own codes below.
type Error struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("client error %d: %s", e.Code, e.Message) }

// Codes the gateway answers with when the client could not be asked.
const (
	// CodeNotAdvertised: the client did not advertise the capability the
	// method needs (elicitation).
	CodeNotAdvertised = -32601
	// CodeNoAnswer: the client did not answer in time, or disconnected.
	CodeNoAnswer = -32603
)

// ErrNoConnection means no gateway holds the connection any more.
var ErrNoConnection = errors.New("ask: connection not found")

// Ask sends method with params to the client behind connID and waits for
// its answer, at most timeout.
func Ask(ctx context.Context, nc *nats.Conn, connID, method string, params any, timeout time.Duration) (json.RawMessage, error) {
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, fmt.Errorf("ask params: %w", err)
	}
	req, _ := json.Marshal(Request{Method: method, Params: raw, TimeoutMS: timeout.Milliseconds()})
	// The NATS wait covers the client's time plus the relay.
	ctx, cancel := context.WithTimeout(ctx, timeout+2*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subjects.ConnAsk(connID), req)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, ErrNoConnection
	}
	if err != nil {
		return nil, fmt.Errorf("ask %s: %w", method, err)
	}
	var rep Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return nil, fmt.Errorf("ask reply: %w", err)
	}
	if rep.Error != nil {
		return nil, rep.Error
	}
	return rep.Result, nil
}
