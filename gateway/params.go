package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/clawmesh/clawmesh/gateway/errmap"
	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
)

// decodeParams reads params into v. A failure is -32602 with a message
// that names the field, e.g. "Invalid params: `size_bytes` must be an
// integer". Unknown fields are ignored, as zerocode may send more.
//
// Before unmarshalling, jsonrpc.CheckParams refuses what no method may
// take: a duplicate key anywhere (encoding/json would silently keep the
// last), a NUL character in any string or key (PostgreSQL cannot store
// it), and nesting deeper than jsonrpc.MaxParamsDepth.
func decodeParams(params json.RawMessage, v any) error {
	if len(params) == 0 || bytes.Equal(params, []byte("null")) {
		params = []byte("{}")
	}
	if params[0] != '{' {
		return invalidParams("params must be an object")
	}
	if err := jsonrpc.CheckParams(params); err != nil {
		return invalidParams(err.Error())
	}
	if err := json.Unmarshal(params, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return invalidParams(fmt.Sprintf("`%s` must be %s", typeErr.Field, article(typeErr.Type.Kind())))
		}
		return invalidParams(err.Error())
	}
	return nil
}

// checkStructs refuses keys equal under case folding in raw, a member
// named field that the method decodes into structs down to depth
// containers (jsonrpc.CheckStructs): decodeParams folds only the keys of
// params itself, and encoding/json would take "PATH" for "path" in a
// nested struct too, the last one winning. The error names the key by
// its whole path, e.g. "`files[1].Path` appears twice".
func checkStructs(raw json.RawMessage, field string, depth int) error {
	var pe *jsonrpc.ParamsError
	if err := jsonrpc.CheckStructs(raw, depth); errors.As(err, &pe) {
		switch {
		case pe.Path == "":
			pe.Path = field
		case pe.Path[0] == '[':
			pe.Path = field + pe.Path
		default:
			pe.Path = field + "." + pe.Path
		}
		return invalidParams(pe.Error())
	}
	return nil
}

// article names what a field of kind takes, as a client would say it: a
// count given 1.5 is told it needs an integer, not "a number" it sent.
func article(kind reflect.Kind) string {
	switch kind {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "an object"
	}
	return "of another type"
}

func invalidParams(msg string) *jsonrpc.Error {
	return jsonrpc.NewError(jsonrpc.CodeInvalidParams, "Invalid params: "+strings.TrimPrefix(msg, "json: "), nil)
}

// serviceError maps an error from a call to service to the client's
// JSON-RPC error: the one place where gRPC status meets the wire.
func serviceError(service string, err error) *jsonrpc.Error {
	we := errmap.ToWire(service, err)
	var data any
	if we.Data != nil {
		data = we.Data
	}
	return jsonrpc.NewError(we.Code, we.Message, data)
}
