package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/jsonexact"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// configValue reads a required JSON value param named field, the value
// of prop. Numbers are read exactly: one a float64 would round (an
// integer past ±2^53, as 2^53+1 for plugins.limits.call_fuel) is refused
// naming the prop, never stored as another number.
func configValue(raw json.RawMessage, field, prop string) (*structpb.Value, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("`%s` is required", field)
	}
	// JSON is UTF-8; the decoder reads a byte that is not as U+FFFD, and
	// the value stored would not be the one sent.
	if !utf8.Valid(raw) {
		return nil, fmt.Errorf("`%s` of `%s` is not UTF-8 text", field, prop)
	}
	v, err := jsonexact.Decode(raw)
	switch {
	case errors.Is(err, jsonexact.ErrInexact):
		return nil, fmt.Errorf("`%s`: %w", prop, err)
	case err != nil:
		return nil, fmt.Errorf("`%s` is not valid JSON", field)
	}
	pv, err := structpb.NewValue(v)
	if err != nil {
		return nil, fmt.Errorf("`%s`: %w", field, err)
	}
	return pv, nil
}

// maxWriteValues bounds the JSON values (each array element and object
// member, at any depth) one config write carries. Decoded for the config
// service, a value of 8 MiB of "1," took 80 bytes of memory for every two
// of JSON: 910 MiB allocated for one frame, 3 GiB of the gateway's
// resident set for six, from a principal without any config permission,
// before the config service was asked. A config document is at most 4
// MiB; no write of one needs more values than this.
const maxWriteValues = 16 << 10

// checkWriteSize refuses, before anything is decoded, a write whose field
// is larger than a config document may be or carries more than
// maxWriteValues values.
func checkWriteSize(raw json.RawMessage, field string) error {
	if len(raw) > configschema.MaxDocumentBytes {
		return fmt.Errorf("`%s` is %d bytes, more than a config document may be; the limit is %d", field, len(raw), configschema.MaxDocumentBytes)
	}
	if n := jsonValues(raw); n > maxWriteValues {
		return fmt.Errorf("`%s` holds %d JSON values or more, more than a config write may carry; the limit is %d", field, n, maxWriteValues)
	}
	return nil
}

// jsonValues counts the values of the JSON text raw, at least: every
// comma and opening bracket outside a string starts one more.
func jsonValues(raw []byte) int {
	n, in, esc := 1, false, false
	for _, b := range raw {
		switch {
		case esc:
			esc = false
		case in:
			if b == '\\' {
				esc = true
			} else if b == '"' {
				in = false
			}
		case b == '"':
			in = true
		case b == ',' || b == '[' || b == '{':
			n++
		}
	}
	return n
}

// invalidEntry refuses one set-many entry, naming its index.
func invalidEntry(i int, msg string) *jsonrpc.Error {
	return jsonrpc.NewError(jsonrpc.CodeInvalidParams, fmt.Sprintf("Invalid params: sets[%d]: %s", i, msg),
		map[string]any{"reason": rpcerr.ReasonInvalid, "index": i})
}

type configGetParams struct {
	Prop string `json:"prop"`
}

// configGet is config/get {prop?} -> {prop, value}; secrets read masked.
func (g *Gateway) configGet(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p configGetParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	ctx, cancel, cut := g.configWait(ctx)
	defer cancel()
	resp, err := g.config.Get(ctx, &configv1.GetRequest{Principal: cs.principalOf(), Prop: p.Prop})
	if err != nil {
		return nil, configError(err, cut(), false)
	}
	return map[string]any{"prop": p.Prop, "value": resp.GetValue().AsInterface()}, nil
}

type configSetParams struct {
	Prop  string          `json:"prop"`
	Value json.RawMessage `json:"value"`
}

// configSet is config/set {prop, value} -> {prop, set:true}.
func (g *Gateway) configSet(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p configSetParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.Prop == "" {
		return nil, invalidParams("`prop` is required")
	}
	if err := checkWriteSize(p.Value, "value"); err != nil {
		return nil, invalidParams(err.Error())
	}
	v, err := configValue(p.Value, "value", p.Prop)
	if err != nil {
		return nil, invalidParams(err.Error())
	}
	ctx, cancel, cut := g.configWait(ctx)
	defer cancel()
	resp, err := g.config.Set(ctx, &configv1.SetRequest{Principal: cs.principalOf(), Prop: p.Prop, Value: v})
	if err != nil {
		return nil, configError(err, cut(), true)
	}
	cs.wroteConfig(resp.GetRevision())
	return withRestart(map[string]any{"prop": p.Prop, "set": true}, []string{p.Prop}), nil
}

type configSetManyParams struct {
	Sets json.RawMessage `json:"sets"`
}

// configSetMany is config/set-many {sets:[{prop, value}]} -> {props,
// set:true}. Entries are read one by one so that a malformed one is named
// by its index; the count and everything else is the config service's.
func (g *Gateway) configSetMany(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p configSetManyParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	var raws []json.RawMessage
	if len(p.Sets) == 0 || bytes.Equal(p.Sets, []byte("null")) {
		return nil, invalidParams("`sets` is required")
	}
	if err := checkWriteSize(p.Sets, "sets"); err != nil {
		return nil, invalidParams(err.Error())
	}
	if err := json.Unmarshal(p.Sets, &raws); err != nil {
		return nil, invalidParams("`sets` must be an array")
	}
	// Each entry is decoded into a struct, whose fields match keys
	// whatever their case: "prop" and "PROP" are one key, as in params.
	if err := checkStructs(p.Sets, "sets", 2); err != nil {
		return nil, err
	}
	entries := make([]*configv1.Entry, len(raws))
	for i, raw := range raws {
		var e struct {
			Prop  *string         `json:"prop"`
			Value json.RawMessage `json:"value"`
		}
		if len(raw) == 0 || raw[0] != '{' {
			return nil, invalidEntry(i, "must be an object with `prop` and `value`")
		}
		if json.Unmarshal(raw, &e) != nil {
			return nil, invalidEntry(i, "must be an object with `prop` and `value`")
		}
		if e.Prop == nil || *e.Prop == "" {
			return nil, invalidEntry(i, "`prop` is required")
		}
		pv, err := configValue(e.Value, "value", *e.Prop)
		if err != nil {
			return nil, invalidEntry(i, err.Error())
		}
		entries[i] = &configv1.Entry{Prop: *e.Prop, Value: pv}
	}
	ctx, cancel, cut := g.configWait(ctx)
	defer cancel()
	resp, err := g.config.SetMany(ctx, &configv1.SetManyRequest{Principal: cs.principalOf(), Sets: entries})
	if err != nil {
		return nil, configError(err, cut(), true)
	}
	cs.wroteConfig(resp.GetRevision())
	props := resp.GetProps()
	if props == nil {
		props = []string{}
	}
	return withRestart(map[string]any{"props": props, "set": true}, props), nil
}

// withRestart adds requires_restart to a write's result: the props among
// those written (or deleted) that the stack reads only at start (the schema's Restart
// flag), so a client can tell the operator the change waits for a
// restart.
func withRestart(result map[string]any, props []string) map[string]any {
	var restart []string
	for _, prop := range props {
		if p, err := configschema.Lookup(prop); err == nil && p.Restart {
			restart = append(restart, prop)
		}
	}
	if len(restart) > 0 {
		result["requires_restart"] = restart
	}
	return result
}

type configListParams struct {
	Prefix string `json:"prefix"`
}

// configList is config/list {prefix?} -> {entries:[{prop, value}]}.
func (g *Gateway) configList(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p configListParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	ctx, cancel, cut := g.configWait(ctx)
	defer cancel()
	resp, err := g.config.List(ctx, &configv1.ListRequest{Principal: cs.principalOf(), Prefix: p.Prefix})
	if err != nil {
		return nil, configError(err, cut(), false)
	}
	entries := make([]map[string]any, len(resp.GetEntries()))
	for i, e := range resp.GetEntries() {
		entries[i] = map[string]any{"prop": e.GetProp(), "value": e.GetValue().AsInterface()}
	}
	return map[string]any{"entries": entries}, nil
}

type configDeleteParams struct {
	Prop string `json:"prop"`
}

// configDelete is config/delete {prop} -> {prop, deleted:true,
// requires_restart?}: a
// property goes back to its default, a map entry is removed.
func (g *Gateway) configDelete(ctx context.Context, cs *connState, params json.RawMessage) (any, error) {
	var p configDeleteParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if p.Prop == "" {
		return nil, invalidParams("`prop` is required")
	}
	ctx, cancel, cut := g.configWait(ctx)
	defer cancel()
	resp, err := g.config.Delete(ctx, &configv1.DeleteRequest{Principal: cs.principalOf(), Prop: p.Prop})
	if err != nil {
		return nil, configError(err, cut(), true)
	}
	cs.wroteConfig(resp.GetRevision())
	// A property read only at start goes back to its default at the next
	// restart, as a set of it would take effect then.
	return withRestart(map[string]any{"prop": p.Prop, "deleted": true}, []string{p.Prop}), nil
}

// configWait bounds a call to the config service to awayStatusWait when
// the health monitor found config unanswering (a hung process:
// SIGSTOPped, swapped out), as status does for the session service and
// initialize for the operator; cut reports that it did. A config/get
// waited the whole call deadline then (10 s, 30 s for a write) to say
// "config timed out", what health had said within a poll. Long enough
// for a busy service that still answers.
//
// The call is cut only if health still finds config unanswering when
// the wait is over: one poll that timed out (a config slow for a
// moment, alive) cut every call that took longer, saying config did
// not answer its health check, for as long as the monitor's record
// stood, and a call in flight when config came back was cut all the
// same.
func (g *Gateway) configWait(ctx context.Context) (_ context.Context, cancel context.CancelFunc, cut func() bool) {
	if g.monitor.statusOf("config") != "unreachable" {
		return ctx, func() {}, func() bool { return false }
	}
	ctx, cancelCause := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTimer(awayStatusWait)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if g.monitor.statusOf("config") == "unreachable" {
				cancelCause(errConfigHung)
				return
			}
			// Answering again: looked at again a wait later, so that
			// a config that hangs anew is cut then.
			t.Reset(awayStatusWait)
		}
	}()
	return ctx, func() { cancelCause(nil) }, func() bool { return errors.Is(context.Cause(ctx), errConfigHung) }
}

// errConfigHung ends a call configWait cut short.
var errConfigHung = errors.New(configHungMessage)

// configError is a config call's failure as the client reads it. A call
// cut short by configWait says that config does not answer (its health
// neither), and a write that its change may still be applied: the
// request may wait in the hung process's socket and be served when it
// runs again.
func configError(err error, cut, write bool) *jsonrpc.Error {
	if !cut || status.Code(err) != codes.Canceled {
		return serviceError("config", err)
	}
	msg := configHungMessage
	if write {
		msg += "; the change may still be applied once it answers"
	}
	return jsonrpc.NewError(jsonrpc.CodeInternal, msg, nil)
}

// configHungMessage is the failure of a call to a config service that
// neither answers it nor its health check.
const configHungMessage = "config: not answering (hung: its health check goes unanswered too)"
