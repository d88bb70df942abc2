package pluginsandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/configclient"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// ConfigService is the wasmhost.ConfigSource of a running sandbox: it
// resolves one plugin instance's values through the config service's
// PluginValues RPC, one RPC per call frame, so the public config and every
// secret a call reads come from one canonical revision.
//
// The answer is turned back into the operator's string form
// (plugins.entries.<key>.config) that the host materialises against the
// manifest's schema: strings as they are, booleans, numbers, arrays and
// objects as JSON text. Keys the config service lists in denied answer
// access-denied to secrets_get; keys it does not return answer not-found.
// Unavailable (or a deadline) wraps wasmhost.ErrConfigUnavailable, which
// guest imports answer as unavailable. A config service that does not
// implement PluginValues (Unimplemented) counts as "no config stored".
type ConfigService struct {
	Client configv1.ConfigServiceClient
	Log    *zap.Logger

	unimplemented sync.Once
}

// Resolve implements wasmhost.ConfigSource. The principal of the call, when
// the server put one in ctx (withPrincipal), is passed on for the config
// service's secret authorization.
func (c *ConfigService) Resolve(ctx context.Context, instanceKey string) (wasmhost.ConfigRevision, error) {
	// Bounded as every per-request config call is: with the config
	// service hung, a call frame (a channel's poll has no deadline)
	// waited the connection's keepalive or for ever.
	cctx, cancel := configclient.Bounded(ctx)
	defer cancel()
	resp, err := c.Client.PluginValues(cctx, &configv1.PluginValuesRequest{
		Principal: principalFrom(ctx), PluginKey: instanceKey,
	})
	if noAnswer := configclient.NoAnswer(cctx, err); noAnswer != err {
		return wasmhost.ConfigRevision{}, fmt.Errorf("%w: %w", wasmhost.ErrConfigUnavailable, noAnswer)
	}
	switch status.Code(err) {
	case codes.OK:
	case codes.Unimplemented:
		c.unimplemented.Do(func() {
			if c.Log != nil {
				c.Log.Warn("config service does not implement PluginValues; plugins run with no stored config")
			}
		})
		return wasmhost.ConfigRevision{}, wasmhost.ErrNoConfig
	case codes.NotFound:
		return wasmhost.ConfigRevision{}, wasmhost.ErrNoConfig
	case codes.Unavailable, codes.DeadlineExceeded:
		return wasmhost.ConfigRevision{}, fmt.Errorf("%w: config service: %s", wasmhost.ErrConfigUnavailable, status.Code(err))
	default:
		return wasmhost.ConfigRevision{}, fmt.Errorf("pluginsandbox: plugin values: %w", err)
	}
	values := make(map[string]string, len(resp.GetConfig().GetFields())+len(resp.GetSecrets()))
	for k, v := range resp.GetConfig().GetFields() {
		text, ok := operatorText(v)
		if ok {
			values[k] = text
		}
	}
	for k, v := range resp.GetSecrets() {
		values[k] = v
	}
	return wasmhost.ConfigRevision{
		Revision: strconv.FormatInt(resp.GetRevision(), 10),
		Values:   values,
		Denied:   resp.GetDenied(),
	}, nil
}

// operatorText is the stored string form of one value; null is absent.
func operatorText(v *structpb.Value) (string, bool) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue, true
	case *structpb.Value_NullValue, nil:
		return "", false
	default:
		b, err := json.Marshal(v.AsInterface())
		if err != nil {
			return "", false
		}
		return string(b), true
	}
}

type principalKey struct{}

// withPrincipal records the caller's principal for ConfigService.
func withPrincipal(ctx context.Context, p *commonv1.Principal) context.Context {
	if p == nil {
		return ctx
	}
	return context.WithValue(ctx, principalKey{}, p)
}

func principalFrom(ctx context.Context) *commonv1.Principal {
	p, _ := ctx.Value(principalKey{}).(*commonv1.Principal)
	return p
}
