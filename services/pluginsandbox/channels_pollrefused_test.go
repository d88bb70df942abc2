package pluginsandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmbin"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// stickyWebhook is the webhook example with one change: a message whose
// id starts with "sticky" or "deaf" is held once answered, and answered
// again at every poll after; told that the host refused it
// (channel_poll_refused), the plugin drops a "sticky" one and keeps a
// "deaf" one all the same. It stands for a plugin that moves past a
// message of its own service only once it knows what became of it (a
// mail channel marking a message read), and for one that ignores the
// word. Each poll and each word is a log record of its own.
const stickyWebhook = `//go:build wasip1

package main

import (
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/channel"
)

type sticky struct{ webhook }

var held *channel.Message

func (s sticky) PollMessage() (*channel.Message, error) {
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "poll", Outcome: "started", Message: "sticky poll"})
	if held != nil {
		return held, nil
	}
	m, err := s.webhook.PollMessage()
	if m != nil && (strings.HasPrefix(m.ID, "sticky") || strings.HasPrefix(m.ID, "deaf")) {
		held = m
	}
	return m, err
}

func (sticky) PollRefused(r channel.Refusal) error {
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "poll", Outcome: "denied", Message: "told " + r.ID + " " + r.Field})
	if held != nil && held.ID == r.ID && strings.HasPrefix(r.ID, "sticky") {
		held = nil
	}
	return nil
}

func init() { channel.Register(sticky{}) } // after main.go's init
`

// formerWebhook is the webhook example as a plugin built for the ABI
// before channel_poll_refused: its channel does not take the word (the
// embedded interface hides the example's PollRefused), so it does not
// advertise the flag, and withoutPollRefused takes the export out of
// its module.
const formerWebhook = `//go:build wasip1

package main

import "github.com/clawmesh/clawmesh/plugins/pdk/channel"

type former struct{ channel.Channel }

func init() { channel.Register(former{webhook{}}) } // after main.go's init
`

// withoutPollRefused renames the module's export channel_poll_refused,
// so that it exports the functions of a module built before it existed.
// The name is the export's, the name section's and a string of the Go
// runtime's; renamed in all three, it is exported no more.
func withoutPollRefused(t *testing.T, wasm []byte) []byte {
	t.Helper()
	out := bytes.ReplaceAll(wasm, []byte(abi.ExportChannelPollRefused), []byte("x"+abi.ExportChannelPollRefused[1:]))
	m, err := wasmbin.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if m.HasExport(abi.ExportChannelPollRefused) || !m.HasExport(abi.ExportChannelPollMessage) {
		t.Fatalf("the renamed module's exports: %v", m.Exports)
	}
	if err := guestbuild.Precompile(out); err != nil {
		t.Fatal(err)
	}
	return out
}

// stickyServer is channelServerHook with the webhook's module replaced
// by the example built with the overlay src (testhooks.go), and a host
// whose plugins' own log records the returned sink keeps.
func stickyServer(t *testing.T, sessions sessionv1.SessionServiceClient, hook, src string, edit func(*testing.T, []byte) []byte) (*testServer, *recordingSink) {
	t.Helper()
	dir := t.TempDir()
	installExample(t, dir, "webhook")
	wasm, err := guestbuild.WasmWith("webhook", "testhooks.go", src)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(wasm)
	if err == nil && edit != nil {
		data = edit(t, data)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "webhook", "plugin.wasm"), data, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, "web"), map[string]string{"webhook_url": hook, "token": "tok"})
	ctx := context.Background()
	sink := &recordingSink{}
	host, err := wasmhost.New(ctx, wasmhost.Config{CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes, Logger: zap.NewNop(), LogSink: sink,
		HTTP: wasmhost.HTTPLimits{AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	return newTestServer(t, dir, func(c *pluginsandbox.Config) {
		c.Host = host
		c.ConfigSource = cfg
		c.Sessions = sessions
		c.Reveal = func(context.Context, string) (string, error) { return chanToken, nil }
	}), sink
}

// count is how many of the plugin's own records say msg.
func (s *recordingSink) count(msg string) int {
	n := 0
	for _, m := range s.messages() {
		if m == msg {
			n++
		}
	}
	return n
}

// hostLogs is how many of the sandbox's log entries hold msg.
func hostLogs(logs *observer.ObservedLogs, level zapcore.Level, msg string) int {
	n := 0
	for _, e := range logs.All() {
		if e.Level == level && strings.Contains(e.Message, msg) {
			n++
		}
	}
	return n
}

// A plugin that answers the same refused message again at its next poll
// (here a message it holds until it knows what became of it) stalled its
// channel: the ABI had no way to tell it that the host refused the
// message, so it answered it at every poll, and the messages queued
// behind it were never delivered (this test failed with "nothing
// received within 1m0s" waiting for the next one). Told now
// (channel_poll_refused), it drops the message and the channel goes on.
func TestChannelPluginToldOfItsRefusedMessageMovesOn(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts, sink := stickyServer(t, fs, hook, stickyWebhook, nil)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	postBad(t, web.Listen, "sticky-1", badBytes)
	want := fmt.Sprintf("not delivered: it is %d bytes long, and this channel takes messages of at most %d bytes", 3*badBytes, 1<<20)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || r["thread_id"] != "t-1" || !strings.Contains(r["content"], want) {
		t.Fatalf("reply to a message past the poll's bound: %v, want ann told on t-1 %q", r, want)
	}
	postText(t, web.Listen, "m2", "next")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
		t.Fatalf("prompt of %d bytes (%.40q), want next", len(p.prompt), p.prompt)
	}
	// The plugin's records reach the sink from the host's queue.
	testwait.Progress(t, 10*time.Millisecond, func() (int64, bool) {
		n := sink.count("told sticky-1 content")
		return int64(n), n > 0
	})
	if n := sink.count("told sticky-1 content"); n != 1 {
		t.Fatalf("the plugin was told of the refusal %d times, want once; its records: %q", n, sink.messages())
	}
	if n := hostLogs(ts.logs, zapcore.WarnLevel, "answered again a message refused"); n != 0 {
		t.Fatalf("%d warnings of a message answered again by a plugin that dropped it", n)
	}
	select {
	case r := <-replies:
		t.Fatalf("a second reply: %v", r)
	default:
	}
}

// A plugin told of the refusal that answers the message all the same
// stalls its channel as one never told did, and must not make the host
// spin: it is polled at the poll interval (or when a message is queued),
// told at each of those polls, its sender told once, and the refusal
// logged once, with the repeat.
func TestChannelPluginDeafToTheRefusalIsPolledAtTheInterval(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts, sink := stickyServer(t, fs, hook, stickyWebhook, nil)
	start := time.Now()
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	postBad(t, web.Listen, "deaf-1", badBytes)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")
	const told = "told deaf-1 content"
	testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
		n := sink.count(told)
		return int64(n), n >= 4
	})
	elapsed := time.Since(start)
	polls, words := sink.count("sticky poll"), sink.count(told)
	t.Logf("%d polls and %d words of the refusal in %v", polls, words, elapsed)
	// Woken by the ticker, the two posts and the first refusal's
	// immediate next poll, with one of room.
	if most := int(elapsed/time.Second) + 5; polls > most || words > polls {
		t.Fatalf("%d polls, %d words of the refusal in %v: want at most %d polls, one word each at most", polls, words, elapsed, most)
	}
	for msg, want := range map[string]int{
		"channel message refused: past the bound of a polled message": 1,
		"answered again a message refused for its size":               1,
	} {
		if n := hostLogs(ts.logs, zapcore.WarnLevel, msg); n != want {
			t.Errorf("%q logged %d times, want %d", msg, n, want)
		}
	}
	listed, err := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c := listed.GetChannels()[0]; c.GetState() != "running" || !strings.Contains(c.GetReason(), "was told it was refused, and answers it all the same") {
		t.Errorf("binding %s: %q", c.GetState(), c.GetReason())
	}
	select {
	case r := <-replies:
		t.Fatalf("a second reply: %v", r)
	case p := <-fs.prompts:
		t.Fatalf("a prompt behind the stalled message: %q", p.prompt)
	default:
	}
}

// A plugin built before channel_poll_refused (no flag, no export) loads
// and runs as it did: it delivers, its refused message's sender is told,
// and it is never called for the word.
func TestChannelPluginOfTheFormerABIRunsAsBefore(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts, sink := stickyServer(t, fs, hook, formerWebhook, withoutPollRefused)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if web.GetState() != "running" {
		t.Fatalf("binding %s: %q", web.GetState(), web.GetReason())
	}

	postBad(t, web.Listen, "m1", badBytes)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
		t.Fatalf("prompt of %d bytes (%.40q), want next", len(p.prompt), p.prompt)
	}
	for _, m := range sink.messages() {
		if strings.Contains(m, "refused by the host") {
			t.Fatalf("a plugin without the flag was told: %q", m)
		}
	}
	if n := hostLogs(ts.logs, zapcore.WarnLevel, "channel message refused"); n != 1 {
		t.Fatalf("the refusal logged %d times, want once", n)
	}
}
