package wasmhost_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/plugins/abi"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// The webhook example takes the word of a refusal (poll_refused): a
// message past the poll's bound is refused, the plugin is told of it
// right after its poll (channel_poll_refused, which the example logs),
// and the next poll answers the next message.
func TestWebhookIsToldOfARefusedMessage(t *testing.T) {
	m, err := manifest.Load(filepath.Join(repoRoot(), "plugins", "examples", "webhook"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, ""), map[string]string{"webhook_url": "http://127.0.0.1:1/", "token": "tok"})
	sink := &recordingSink{}
	h := newHost(t, wasmhost.Limits{}, func(c *wasmhost.Config) { c.LogSink = sink })
	ch := loadChannel(t, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{ConfigRead: true, HTTPClient: true}
	})
	if !ch.Capabilities().PollRefused {
		t.Fatalf("the webhook example does not advertise %s: %+v", abi.FlagPollRefused, ch.Capabilities())
	}
	ch.SetPollContentBytes(16)
	for _, text := range []string{strings.Repeat("x", 17), "next"} {
		if err := ch.Inbound().Push(map[string]string{"id": "m-" + text[:1], "from": "bea", "text": text, "thread": "t"}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	_, err = ch.PollMessage(ctx, wasmhost.CallInfo{})
	var refused *wasmhost.PollRefusedError
	if !errors.As(err, &refused) || !refused.Told || refused.TellErr != nil || refused.Field != "content" || refused.Size != 17 || refused.Bound != 16 {
		t.Fatalf("poll of 17 bytes at a bound of 16: %v (%+v)", err, refused)
	}
	if msg, err := ch.PollMessage(ctx, wasmhost.CallInfo{}); err != nil || msg == nil || msg.Content != "next" {
		t.Fatalf("the poll after the refusal: %+v, %v", msg, err)
	}
	// Records reach the sink from the host's queue, in their order: the
	// refusal's is the one before the second poll's end.
	var told []wasmhost.LogRecord
	testwait.Progress(t, 10*time.Millisecond, func() (int64, bool) {
		told = told[:0]
		for _, r := range sink.all() {
			if r.Message == "message refused by the host; dropped" {
				told = append(told, r)
			}
		}
		return int64(len(told)), len(told) > 0
	})
	if r := told[0]; len(told) != 1 || r.Fields["id"] != "m-x" || r.Fields["field"] != "content" || r.Fields["bytes"] != "17" || r.Fields["bound"] != "16" {
		t.Fatalf("the webhook's records of the refusal: %+v", told)
	}
}

// A plugin that advertises poll_refused must export channel_poll_refused
// (the export is optional, so checkABI does not ask for it): without it,
// every refusal's word would fail. It is refused at load.
func TestChannelFlagWithoutItsExportIsRefused(t *testing.T) {
	// The name is the export's, the name section's and a string of the
	// Go runtime's: renamed in all three, it is exported no more.
	wasm := bytes.ReplaceAll(guest(t, "webhook"), []byte(abi.ExportChannelPollRefused), []byte("x"+abi.ExportChannelPollRefused[1:]))
	if err := guestbuild.Precompile(wasm); err != nil {
		t.Fatal(err)
	}
	h := newHost(t, wasmhost.Limits{})
	_, err := h.LoadChannel(context.Background(), wasmhost.PluginSpec{Name: "webhook", Version: "0.1.0", Wasm: wasm}, nil)
	if !errors.Is(err, wasmhost.ErrABI) || !strings.Contains(err.Error(), abi.ExportChannelPollRefused) {
		t.Fatalf("load of a module with the flag and without the export: %v", err)
	}
}
