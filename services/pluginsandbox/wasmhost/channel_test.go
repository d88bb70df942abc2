package wasmhost_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

func loadChannel(tb testing.TB, h *wasmhost.Host, name string, mut ...func(*wasmhost.PluginSpec)) *wasmhost.Channel {
	tb.Helper()
	spec := wasmhost.PluginSpec{Name: name, Version: "0.1.0", Wasm: guest(tb, name)}
	for _, m := range mut {
		m(&spec)
	}
	ch, err := h.LoadChannel(context.Background(), spec, nil)
	if err != nil {
		tb.Fatalf("load channel %s: %v", name, err)
	}
	tb.Cleanup(func() { _ = ch.Close(context.Background()) })
	return ch
}

// webhookServer records the POSTs the webhook channel makes.
type webhookServer struct {
	*httptest.Server
	mu    sync.Mutex
	posts []webhookPost
}

type webhookPost struct {
	auth string
	body map[string]string
}

func newWebhookServer(t *testing.T) *webhookServer {
	s := &webhookServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]string
		_ = json.Unmarshal(raw, &body)
		s.mu.Lock()
		s.posts = append(s.posts, webhookPost{auth: r.Header.Get("Authorization"), body: body})
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *webhookServer) all() []webhookPost {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]webhookPost(nil), s.posts...)
}

// The example channel end to end: config and secret resolved at the point
// of use in every call, outbound HTTP (tool and channel have it), the
// host-fed inbound queue drained through inbound_pending and inbound_poll,
// the documented defaults for unset capability flags.
func TestWebhookChannelExample(t *testing.T) {
	m, err := manifest.Load(filepath.Join(repoRoot(), "plugins", "examples", "webhook"))
	if err != nil {
		t.Fatal(err)
	}
	srv := newWebhookServer(t)
	cfg := &wasmhost.MemoryConfig{}
	key := wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, "")
	cfg.Set(key, map[string]string{"webhook_url": srv.URL, "token": "tok-1"})
	h := newHost(t, wasmhost.Limits{})
	ch := loadChannel(t, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{ConfigRead: true, HTTPClient: true}
	})
	ctx := context.Background()
	if ch.Name() != "webhook" || ch.Capabilities() != (wasmhost.ChannelCapabilities{Health: true, PollRefused: true}) {
		t.Fatalf("metadata = %q %+v", ch.Name(), ch.Capabilities())
	}
	if err := ch.Configure(ctx, wasmhost.CallInfo{CallID: "c1"}); err != nil {
		t.Fatalf("configure: %v", err)
	}
	if ok, err := ch.Health(ctx); err != nil || !ok {
		t.Fatalf("health = %v, %v", ok, err)
	}
	// Typing is not advertised: a no-op that never reaches the plugin.
	if err := ch.StartTyping(ctx, "ana"); err != nil {
		t.Fatalf("typing: %v", err)
	}

	if err := ch.Send(ctx, wasmhost.CallInfo{}, wasmhost.SendMessage{Recipient: "ana", Content: "hola"}); err != nil {
		t.Fatalf("send: %v", err)
	}
	// Rotation is seen by the next call: nothing was kept in the guest.
	cfg.Set(key, map[string]string{"webhook_url": srv.URL, "token": "tok-2"})
	if err := ch.Send(ctx, wasmhost.CallInfo{}, wasmhost.SendMessage{Recipient: "ana", Content: "adiós"}); err != nil {
		t.Fatalf("send: %v", err)
	}
	posts := srv.all()
	if len(posts) != 2 || posts[0].auth != "Bearer tok-1" || posts[1].auth != "Bearer tok-2" ||
		posts[0].body["recipient"] != "ana" || posts[1].body["content"] != "adiós" {
		t.Fatalf("posts = %+v", posts)
	}

	// Inbound: the host pushes, the plugin drains in order; a message larger
	// than the guest's first buffer is retried, not lost.
	big := strings.Repeat("x", 5000)
	for _, text := range []string{"uno", big, "tres"} {
		if err := ch.Inbound().Push(map[string]string{"id": text[:1], "from": "bea", "text": text}); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"uno", big, "tres"} {
		msg, err := ch.PollMessage(ctx, wasmhost.CallInfo{})
		if err != nil || msg == nil || msg.Content != want || msg.Sender != "bea" || msg.ReplyTarget != "bea" {
			t.Fatalf("poll: %+v, %v (want %.10q)", msg, err, want)
		}
	}
	if msg, err := ch.PollMessage(ctx, wasmhost.CallInfo{}); err != nil || msg != nil {
		t.Fatalf("empty poll: %+v, %v", msg, err)
	}

	// Without the http_client grant the same call is refused by the host.
	noHTTP := loadChannel(t, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{ConfigRead: true}
	})
	err = noHTTP.Send(ctx, wasmhost.CallInfo{}, wasmhost.SendMessage{Recipient: "ana", Content: "x"})
	if !errors.Is(err, wasmhost.ErrPluginFailed) || !strings.Contains(err.Error(), "access-denied") {
		t.Fatalf("send without http_client: %v", err)
	}
	// Without config_read, config and secrets are access-denied.
	noConfig := loadChannel(t, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{HTTPClient: true}
	})
	if err := noConfig.Configure(ctx, wasmhost.CallInfo{}); !errors.Is(err, wasmhost.ErrPluginFailed) || !strings.Contains(err.Error(), "access-denied") {
		t.Fatalf("configure without config_read: %v", err)
	}
	if len(srv.all()) != 2 {
		t.Fatalf("a refused call reached the server: %+v", srv.all())
	}
}

// A trapped channel instance is never resumed: the next call rebuilds it
// from host-owned state (the inbound queue survives, configure runs again),
// and the guest's own state is gone. A plugin's err result is not a trap.
// Sends run on instances of their own (one hung endpoint held every
// other call on one), so a send's trap leaves the polling instance, and
// the guest state there, as it was.
func TestChannelTrapRebuildsFromHostState(t *testing.T) {
	h := newHost(t, wasmhost.Limits{CallFuel: 100_000_000})
	ch := loadChannel(t, h, "misbehave")
	ctx := context.Background()
	info := wasmhost.CallInfo{}
	send := func(content string) error {
		return ch.Send(ctx, info, wasmhost.SendMessage{Recipient: "r", Content: content})
	}
	poll := func() *wasmhost.ChannelMessage {
		t.Helper()
		msg, err := ch.PollMessage(ctx, info)
		if err != nil || msg == nil {
			t.Fatalf("poll: %+v, %v", msg, err)
		}
		return msg
	}
	if err := ch.Configure(ctx, info); err != nil {
		t.Fatal(err)
	}
	if err := send("a"); err != nil {
		t.Fatal(err)
	}
	if err := send("fail"); !errors.Is(err, wasmhost.ErrPluginFailed) {
		t.Fatalf("err result: %v", err)
	}
	for _, id := range []string{"m1", "m2", "m3"} {
		if err := ch.Inbound().Push(map[string]string{"id": id}); err != nil {
			t.Fatal(err)
		}
	}
	// ID is inbound_pending as the guest saw it before polling.
	if m := poll(); m.ID != "3" || m.ThreadID != "configured=1 sent=0" || !strings.Contains(m.Content, "m1") {
		t.Fatalf("before the trap: %+v", m)
	}
	if ch.Inbound().Pending() != 2 {
		t.Fatalf("pending = %d", ch.Inbound().Pending())
	}

	inUse := h.InstancesInUse()
	if err := send("panic"); !errors.Is(err, wasmhost.ErrTrap) {
		t.Fatalf("panic: %v", err)
	}
	// The polling instance is the one it was, and the queue lost nothing.
	if m := poll(); m.ID != "2" || m.ThreadID != "configured=1 sent=0" || !strings.Contains(m.Content, "m2") {
		t.Fatalf("after the send's trap: %+v", m)
	}

	if err := send("loop"); !errors.Is(err, wasmhost.ErrFuelExhausted) {
		t.Fatalf("loop: %v", err)
	}
	if ok, err := ch.Health(ctx); err != nil || !ok {
		t.Fatalf("health after the second rebuild: %v, %v", ok, err)
	}
	if m := poll(); m.ID != "1" || !strings.Contains(m.Content, "m3") {
		t.Fatalf("last message: %+v", m)
	}
	// Failed instances are closed off the call path; their slots come
	// back. Before the panic the polling instance and the sending ones
	// of "a" and "fail" lived; the panic's instance was built and
	// failed, and "loop" ran on, and failed, the one "a" had used.
	waitInstances(t, h, inUse-1)
	// A sending instance that failed is built again for the next send.
	if err := send("b"); err != nil {
		t.Fatalf("send after the failures: %v", err)
	}

	// Typing is advertised, so the plugin is called.
	if err := ch.StartTyping(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if err := ch.StopTyping(ctx, "carol"); !errors.Is(err, wasmhost.ErrPluginFailed) {
		t.Fatalf("stop typing for another recipient: %v", err)
	}
	if err := ch.StopTyping(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
}

// waitInstances polls until the host has want live instances: failed
// instances are closed, and their slots freed, asynchronously.
func waitInstances(t *testing.T, h *wasmhost.Host, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.InstancesInUse() != want {
		if time.Now().After(deadline) {
			t.Fatalf("instances in use = %d, want %d: a failed instance kept its slot", h.InstancesInUse(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
