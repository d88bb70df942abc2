package wasmhost_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// formerWebhookChannel is the webhook example whose channel does not
// take the word of a refusal (the embedded interface hides its
// PollRefused): no poll_refused flag.
const formerWebhookChannel = `//go:build wasip1

package main

import "github.com/clawmesh/clawmesh/plugins/pdk/channel"

type former struct{ channel.Channel }

func init() { channel.Register(former{webhook{}}) } // after main.go's init
`

// BenchmarkRefusedPoll measures a poll of the webhook example whose
// message (17 bytes of content, at a bound of 16) the host refuses:
// "told" with the plugin told of it (channel_poll_refused, which the
// example logs), "untold" with a channel that does not take the word.
// The difference is what the word costs a refused message.
func BenchmarkRefusedPoll(b *testing.B) {
	m, err := manifest.Load(filepath.Join(repoRoot(), "plugins", "examples", "webhook"))
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"told", "untold"} {
		b.Run(mode, func(b *testing.B) {
			cfg := &wasmhost.MemoryConfig{}
			cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, ""), map[string]string{"webhook_url": "http://127.0.0.1:1/", "token": "tok"})
			h := newHost(b, wasmhost.Limits{})
			ch := loadChannel(b, h, "webhook", func(s *wasmhost.PluginSpec) {
				s.Schema, s.Config = m.Schema(), cfg
				s.Grants = wasmhost.Grants{ConfigRead: true, HTTPClient: true}
				if mode == "untold" {
					s.Wasm = guestWith(b, "webhook", "testhooks.go", formerWebhookChannel)
				}
			})
			ch.SetPollContentBytes(16)
			msg := map[string]string{"id": "m1", "from": "bea", "text": "0123456789abcdefg", "thread": "t"}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				if err := ch.Inbound().Push(msg); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				_, err := ch.PollMessage(ctx, wasmhost.CallInfo{})
				var refused *wasmhost.PollRefusedError
				if !errors.As(err, &refused) {
					b.Fatalf("poll: %v", err)
				}
			}
		})
	}
}
