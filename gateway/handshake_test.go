package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
)

// initialize refuses a protocol_version that is not a JSON integer with
// -32602 naming the field as the client spelled it, before anything is
// resolved; an integer other than 1 is a version mismatch. A string is
// not read as the number it spells, and no decoder's words reach the
// client.
func TestInitializeProtocolVersionMessages(t *testing.T) {
	g := &Gateway{}
	for _, tc := range []struct {
		params string
		code   int64
		msg    string
	}{
		{`{"protocol_version":"abc"}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":"1"}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":{"x":1}}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":[1]}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":true}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":1.5}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":1.0}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocol_version":1e0}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` must be an integer"},
		{`{"protocolVersion":"1"}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocolVersion` must be an integer"},
		{`{"protocol_version":null}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` is required"},
		{`{}`, jsonrpc.CodeInvalidParams, "Invalid params: `protocol_version` is required"},
		{`{"protocol_version":7}`, jsonrpc.CodeVersionMismatch, "Protocol version mismatch: server=1, client=7"},
		{`{"protocol_version":-1}`, jsonrpc.CodeVersionMismatch, "Protocol version mismatch: server=1, client=-1"},
		{`{"protocol_version":99999999999999999999}`, jsonrpc.CodeVersionMismatch, "Protocol version mismatch: server=1, client=99999999999999999999"},
		{`{"protocol_version":2,"protocolVersion":1}`, jsonrpc.CodeVersionMismatch, "Protocol version mismatch: server=1, client=2"},
		// client_capabilities is decoded into a struct: "elicitation" and
		// "Elicitation" are one field said twice.
		{`{"protocol_version":1,"client_capabilities":{"elicitation":false,"Elicitation":true}}`, jsonrpc.CodeInvalidParams, "Invalid params: `client_capabilities.Elicitation` appears twice"},
		{`{"protocol_version":1,"clientCapabilities":{"ELICITATION":true,"elicitation":false}}`, jsonrpc.CodeInvalidParams, "Invalid params: `clientCapabilities.elicitation` appears twice"},
	} {
		_, err := g.initialize(context.Background(), nil, json.RawMessage(tc.params))
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != tc.code || we.Message != tc.msg {
			t.Errorf("%s: got %v, want %d %q", tc.params, err, tc.code, tc.msg)
		}
	}
}
