package wasmhost_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// A channel's sends run on instances of their own, but a host with no
// instance to spare for them (plugins.limits.max_instances 1, which the
// polling instance holds) sends on the polling one, as before: waiting
// for a slot that never frees failed every answer at the call limit.
func TestChannelSendsWithNoInstanceToSpare(t *testing.T) {
	m, err := manifest.Load(filepath.Join(repoRoot(), "plugins", "examples", "webhook"))
	if err != nil {
		t.Fatal(err)
	}
	srv := newWebhookServer(t)
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, ""), map[string]string{"webhook_url": srv.URL, "token": "tok"})
	h := newHost(t, wasmhost.Limits{MaxInstances: 1, CallTimeoutMS: 2000})
	ch := loadChannel(t, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{ConfigRead: true, HTTPClient: true}
	})
	ctx := context.Background()
	if err := ch.Configure(ctx, wasmhost.CallInfo{}); err != nil {
		t.Fatalf("configure: %v", err)
	}
	if err := ch.Send(ctx, wasmhost.CallInfo{}, wasmhost.SendMessage{Recipient: "ana", Content: "hola"}); err != nil {
		t.Fatalf("send with max_instances 1: %v", err)
	}
	if posts := srv.all(); len(posts) != 1 || posts[0].body["content"] != "hola" {
		t.Fatalf("posts %+v", posts)
	}
}
