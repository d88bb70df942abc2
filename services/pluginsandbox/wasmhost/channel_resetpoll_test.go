package wasmhost_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// countingChannel is the webhook example whose polls answer a message
// numbered by a count kept in the guest's memory, and fail until the
// instance was configured.
const countingChannel = `//go:build wasip1

package main

import (
	"errors"
	"strconv"

	"github.com/clawmesh/clawmesh/plugins/pdk/channel"
)

type counting struct{ webhook }

var (
	polls      int
	configured bool
)

func (c counting) Configure() error {
	configured = true
	return c.webhook.Configure()
}

func (counting) PollMessage() (*channel.Message, error) {
	if !configured {
		return nil, errors.New("polled before channel_configure")
	}
	polls++
	return &channel.Message{ID: strconv.Itoa(polls), Sender: "ann", Content: "x"}, nil
}

func init() { channel.Register(counting{}) } // after main.go's init
`

func countingWebhook(tb testing.TB) *wasmhost.Channel {
	tb.Helper()
	m, err := manifest.Load(filepath.Join(repoRoot(), "plugins", "examples", "webhook"))
	if err != nil {
		tb.Fatal(err)
	}
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, ""), map[string]string{"webhook_url": "http://127.0.0.1:1/", "token": "tok"})
	h := newHost(tb, wasmhost.Limits{})
	ch := loadChannel(tb, h, "webhook", func(s *wasmhost.PluginSpec) {
		s.Schema, s.Config = m.Schema(), cfg
		s.Grants = wasmhost.Grants{ConfigRead: true, HTTPClient: true}
		s.Wasm = guestWith(tb, "webhook", "testhooks.go", countingChannel)
	})
	if err := ch.Configure(context.Background(), wasmhost.CallInfo{}); err != nil {
		tb.Fatal(err)
	}
	return ch
}

// ResetPoll drops the polling instance: the next poll runs on a new one,
// configured again before it, that remembers nothing of the old one's.
// After Close it refuses.
func TestResetPollForgetsThePluginsMemory(t *testing.T) {
	ch := countingWebhook(t)
	ctx := context.Background()
	poll := func(want string) {
		t.Helper()
		msg, err := ch.PollMessage(ctx, wasmhost.CallInfo{})
		if err != nil || msg == nil || msg.ID != want {
			t.Fatalf("poll: %+v, %v; want message %s", msg, err, want)
		}
	}
	poll("1")
	poll("2")
	if err := ch.ResetPoll(ctx); err != nil {
		t.Fatal(err)
	}
	poll("1")
	if err := ch.ResetPoll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ch.ResetPoll(ctx); err != nil {
		t.Fatalf("a reset of a dropped instance: %v", err)
	}
	poll("1")
	if err := ch.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ch.ResetPoll(ctx); !errors.Is(err, wasmhost.ErrClosed) {
		t.Fatalf("a reset after close: %v, want ErrClosed", err)
	}
}

// BenchmarkResetPoll measures a poll on the resident instance ("kept")
// and one after ResetPoll ("reset"): the difference is what the host
// pays to rebuild a plugin that answers a refused message again and
// again, once such a message.
func BenchmarkResetPoll(b *testing.B) {
	for _, mode := range []string{"kept", "reset"} {
		b.Run(mode, func(b *testing.B) {
			ch := countingWebhook(b)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if mode == "reset" {
					if err := ch.ResetPoll(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if msg, err := ch.PollMessage(ctx, wasmhost.CallInfo{}); err != nil || msg == nil {
					b.Fatalf("poll: %+v, %v", msg, err)
				}
			}
		})
	}
}
