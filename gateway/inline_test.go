package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
)

// A method marked inline runs on the connection's read loop with its
// params read in place, in the buffer the next frame is read into
// (jsonrpc.Options.Inline): its handler must keep nothing of them once
// it has returned. initialize decodes them with encoding/json, which
// copies every string and json.RawMessage it fills, and its errors are
// formatted into strings of their own (checked here: the answer to a
// version mismatch is the same once its params are written over); health
// reads none. Nor may it keep the request itself, which the connection
// reuses, or its id, read in place too: a method's call gets only the
// params (Gateway.handle reads the request's Method and Params, and keeps
// neither). No other method is marked without a case here.
func TestInlineMethodsKeepNoParams(t *testing.T) {
	for name, m := range methods {
		if m.inline && name != "initialize" && name != "health" {
			t.Errorf("%s is marked inline, with no case here that its handler keeps nothing of its params", name)
		}
	}
	params := []byte(`{"protocol_version":7,"client_capabilities":{"elicitation":true},"tui_id":"t-1"}`)
	_, err := methods["initialize"].call(&Gateway{}, context.Background(), nil, params)
	for i := range params {
		params[i] = 'A'
	}
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Message != "Protocol version mismatch: server=1, client=7" {
		t.Fatalf("initialize answered %v once its params were written over", err)
	}
	if b, err := json.Marshal(we); err != nil || !json.Valid(b) {
		t.Fatalf("the answer encodes as %s, %v", b, err)
	}
}
