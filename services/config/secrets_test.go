package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configschema"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// Secrets never appear in config/get, config/list, Live, the logs, NATS
// messages or the database; Reveal and a restarted service read them back.
func TestSecretsNeverLeak(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, zap.New(core))
	const apiKey = "sk-super-secret-0123456789"
	const pluginSecret = "plugin-secret-9876543210"
	const badToken = "short secret"

	nc := e.nats()
	msgs := make(chan []byte, 16)
	sub, err := nc.Subscribe(bus.SubjectConfigChanged, func(m *nats.Msg) { msgs <- m.Data })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	e.mustSet(
		kv{"agents.default.api_key", apiKey},
		kv{"plugins.entries.weather.config", map[string]any{"token": pluginSecret, "city": "Lima"}})
	// A refused secret is not echoed either.
	_, err = e.setMany(operator, kv{"durable.token", badToken})
	if err == nil || strings.Contains(err.Error(), badToken) {
		t.Fatalf("bad durable.token: %v", err)
	}

	leaks := func(where string, b []byte) {
		t.Helper()
		for _, s := range []string{apiKey, pluginSecret, badToken} {
			if bytes.Contains(b, []byte(s)) {
				t.Fatalf("%s leaks %q: %s", where, s, b)
			}
		}
	}
	select {
	case m := <-msgs:
		leaks("NATS message", m)
		// The announcement names the revision and props, never values.
		var ch busv1.ConfigChanged
		if err := proto.Unmarshal(m, &ch); err != nil || ch.GetRevision() == 0 || len(ch.GetProps()) != 2 {
			t.Fatalf("announcement %v: %v", &ch, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no change published")
	}

	if v, err := e.get("agents.default.api_key"); err != nil || v != configschema.Masked {
		t.Fatalf("config/get api_key: %v %v", v, err)
	}
	if v, err := e.get("plugins.entries.weather.config"); err != nil || v.(map[string]any)["token"] != configschema.Masked || v.(map[string]any)["city"] != configschema.Masked {
		t.Fatalf("config/get plugin config: %v %v", v, err)
	}
	ctx := ctxFor(t)
	whole, err := e.rpc.Get(ctx, &configv1.GetRequest{Principal: operator})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := whole.GetValue().MarshalJSON()
	leaks("config/get of the whole document", raw)
	list, err := e.rpc.List(ctx, &configv1.ListRequest{Principal: operator})
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range list.GetEntries() {
		raw, _ := en.GetValue().MarshalJSON()
		leaks("config/list "+en.GetProp(), raw)
	}
	live, err := e.rpc.Live(ctx, &configv1.LiveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = live.GetDocument().MarshalJSON()
	leaks("Live", raw)

	var stored []byte
	if err := e.opts.DB.QueryRow(ctx, "SELECT string_agg(document::text, '') FROM revisions").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	leaks("the stored revisions", stored)
	if !bytes.Contains(stored, []byte(encPrefix)) {
		t.Fatalf("secrets not encrypted at rest: %s", stored)
	}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	for _, entry := range logs.All() {
		buf, err := enc.EncodeEntry(entry.Entry, entry.Context)
		if err != nil {
			t.Fatal(err)
		}
		leaks("log line", buf.Bytes())
	}
	if logs.FilterMessage("config committed").Len() == 0 {
		t.Fatal("commits are not logged")
	}

	// Reveal, for services, reads the value.
	rev, err := e.rpc.Reveal(ctx, &configv1.RevealRequest{Prop: "agents.default.api_key"})
	if err != nil || rev.GetValue().GetStringValue() != apiKey {
		t.Fatalf("Reveal: %v %v", rev, err)
	}

	// The key file is 0600 and a restarted service decrypts with it.
	fi, err := os.Stat(filepath.Join(e.opts.DataDir, KeyFileName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, err := New(ctx, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := configschema.Get(again.current().doc, "agents.default.api_key"); got != apiKey {
		t.Fatalf("after restart api_key = %v", got)
	}
	// Another key cannot open them.
	other := e.opts
	other.DataDir = t.TempDir()
	if _, err := New(ctx, other); err == nil || strings.Contains(err.Error(), apiKey) {
		t.Fatalf("a wrong key: %v", err)
	}
}

// The launcher's --set goes through the schema: typed by it, committed as
// one revision by "launcher", not again when already in force, and a bad
// one is an error naming it.
func TestApplyStartup(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	sets := []string{"rpc.max_local_connections=64", "rpc.advertised_server_version=9.9.9", "agents.default.model=123", "agents.default.tools=shell,echo"}
	if err := e.srv.ApplyStartup(ctx, sets); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.ApplyStartup(ctx, sets); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.storedRevisions(); n != 1 {
		t.Fatalf("%d revisions, want 1", n)
	}
	var by string
	if err := e.opts.DB.QueryRow(ctx, "SELECT committed_by FROM revisions").Scan(&by); err != nil || by != LauncherAuthor {
		t.Fatalf("committed by %q %v", by, err)
	}
	live, _ := e.rpc.Live(ctx, &configv1.LiveRequest{})
	rpc := live.GetDocument().AsMap()["rpc"].(map[string]any)
	if rpc["max_local_connections"] != 64.0 || rpc["advertised_server_version"] != "9.9.9" || rpc["max_frame_bytes"] != 8388608.0 {
		t.Fatalf("rpc %v", rpc)
	}
	if v, _ := e.get("agents.default.model"); v != "123" {
		t.Fatalf("a string property takes the text: %v", v)
	}
	if v, _ := e.get("agents.default.tools"); len(v.([]any)) != 2 {
		t.Fatalf("tools %v", v)
	}
	for set, want := range map[string]string{
		"rpc.max_local_connections=lots":      "--set rpc.max_local_connections",
		"rpc.max_local_connections=0":         "below the minimum",
		"rpc.nope=1":                          "unknown config property `rpc.nope`",
		"users.bob.permission_profiles=ghost": `names "ghost"`,
		"novalue":                             "want prop=value",
	} {
		err := e.srv.ApplyStartup(ctx, []string{"agents.default.model=ok", set})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want %q", set, err, want)
		}
	}
	if n, _ := e.storedRevisions(); n != 1 {
		t.Fatalf("refused --set stored something: %d revisions", n)
	}
}

// A secret reads "***MASKED***"; a client that wrote back what it read
// (config/get of the whole document, then set-many of it) stored the
// mask as the secret, and the real one was gone. Writing the mask to a
// secret is refused and the stored secret stays.
func TestMaskWrittenBackIsNotStoredAsTheSecret(t *testing.T) {
	e := newEnv(t, nil)
	ctx := ctxFor(t)
	e.mustSet(kv{"agents.default.api_key", "sk-real-0123456789"}, kv{"plugins.entries.p.config", map[string]any{"k": "v-real", "u": "x"}})
	for _, s := range []kv{
		{"agents.default.api_key", configschema.Masked},
		{"plugins.entries.p.config", map[string]any{"k": configschema.Masked, "u": "y"}},
	} {
		_, err := e.setMany(operator, s)
		if w := wire(err); w.Code != jsonrpc.CodeInvalidParams || !strings.Contains(w.Message, "what a secret reads as") {
			t.Errorf("writing the mask to %s: %v, want -32602", s.prop, err)
		}
	}
	key, err := e.srv.Reveal(ctx, &configv1.RevealRequest{Prop: "agents.default.api_key"})
	if err != nil || key.GetValue().GetStringValue() != "sk-real-0123456789" {
		t.Fatalf("api_key after the mask was written: %v %v", key.GetValue(), err)
	}
	vals, err := e.srv.PluginValues(ctx, &configv1.PluginValuesRequest{PluginKey: "p"})
	if err != nil || vals.GetSecrets()["k"] != "v-real" {
		t.Fatalf("plugin values after the mask was written: %v %v", vals.GetSecrets(), err)
	}
}
