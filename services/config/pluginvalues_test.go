package config

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// The sandbox reads a plugin instance's values unmasked, at the live
// revision, and a pin to an older revision is refused.
func TestPluginValues(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	e.mustSet(kv{"plugins.entries.weather.config", map[string]any{"token": "s3cret", "city": "Lima"}})
	resp, err := e.rpc.PluginValues(ctx, &configv1.PluginValuesRequest{PluginKey: "weather"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetSecrets()["token"] != "s3cret" || resp.GetSecrets()["city"] != "Lima" || resp.GetRevision() == 0 {
		t.Fatalf("values %+v", resp)
	}
	pinned, err := e.rpc.PluginValues(ctx, &configv1.PluginValuesRequest{PluginKey: "weather", Revision: resp.GetRevision()})
	if err != nil || pinned.GetSecrets()["token"] != "s3cret" {
		t.Fatalf("pinned to the live revision: %v %v", pinned, err)
	}
	none, err := e.rpc.PluginValues(ctx, &configv1.PluginValuesRequest{PluginKey: "other"})
	if err != nil || len(none.GetSecrets()) != 0 {
		t.Fatalf("an instance without values: %v %v", none, err)
	}
	e.mustSet(kv{"plugins.entries.weather.config", map[string]any{"token": "rotated"}})
	_, err = e.rpc.PluginValues(ctx, &configv1.PluginValuesRequest{PluginKey: "weather", Revision: resp.GetRevision()})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a pin to an old revision: %v", err)
	}
	if _, err := e.rpc.PluginValues(ctx, &configv1.PluginValuesRequest{PluginKey: "a.b"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad key: %v", err)
	}
}
