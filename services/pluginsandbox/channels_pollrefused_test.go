package pluginsandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
func stickyServer(t *testing.T, sessions sessionv1.SessionServiceClient, hook, src string, edit func(*testing.T, []byte) []byte, mut ...func(*pluginsandbox.Config)) (*testServer, *recordingSink) {
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
	sink := &recordingSink{}
	return webhookSandbox(t, dir, sessions, hook, func(c *wasmhost.Config) { c.LogSink = sink }, mut...), sink
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

// formerStickyWebhook is stickyWebhook built for the ABI before
// channel_poll_refused (its channel hides PollRefused, and
// withoutPollRefused takes the export out of its module): it holds a
// "sticky" message once answered and is never told what became of it.
var formerStickyWebhook = strings.Replace(stickyWebhook, "func init() { channel.Register(sticky{}) }",
	"type former struct{ channel.Channel }\n\nfunc init() { channel.Register(former{sticky{}}) }", 1)

// A plugin that answers again and again a message the host refused for
// its size, never told of the refusal (built before the poll_refused
// flag) or told and keeping it all the same, stalled its channel: the
// messages accepted (202) behind it were never delivered (this test
// failed with "nothing received within 1m0s" waiting for the next one).
// After a bounded number of answers of the same message the host
// rebuilds the plugin's polling instance, which forgets it: the sender
// of the refused message is told once, the next message is delivered,
// the plugin is told at most once an answer, and the operator reads of
// the rebuild in the log and the binding's reason.
func TestChannelPluginKeepingItsRefusedMessageIsRebuilt(t *testing.T) {
	for _, tc := range []struct {
		name, id, src string
		edit          func(*testing.T, []byte) []byte
		told          bool
	}{
		{name: "deaf", id: "deaf-1", src: stickyWebhook, told: true},
		{name: "former", id: "sticky-1", src: formerStickyWebhook, edit: withoutPollRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook, replies := replyHook(t)
			fs := newFakeSessions()
			ts, sink := stickyServer(t, fs, hook, tc.src, tc.edit)
			start := time.Now()
			web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

			postBad(t, web.Listen, tc.id, badBytes)
			if r := testwait.Recv(t, replies); r["recipient"] != "ann" || r["thread_id"] != "t-1" || !strings.Contains(r["content"], "not delivered") {
				t.Fatalf("reply to a message past the poll's bound: %v", r)
			}
			postText(t, web.Listen, "m2", "next")
			if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
				t.Fatalf("prompt of %d bytes (%.40q), want next", len(p.prompt), p.prompt)
			}
			for msg, want := range map[string]int{
				"channel message refused: past the bound of a polled message":           1,
				"answered again a message refused for its size":                         1,
				"channel plugin rebuilt: it answered again and again a message refused": 1,
			} {
				if n := hostLogs(ts.logs, zapcore.WarnLevel, msg); n != want {
					t.Errorf("%q logged %d times, want %d", msg, n, want)
				}
			}
			// The plugin's records reach the sink from the host's queue.
			words := "told " + tc.id + " content"
			if tc.told {
				testwait.Progress(t, 10*time.Millisecond, func() (int64, bool) {
					n := sink.count(words)
					return int64(n), n > 0
				})
			}
			elapsed := time.Since(start)
			polls, told := sink.count("sticky poll"), sink.count(words)
			t.Logf("%d polls, %d words of the refusal in %v", polls, told, elapsed)
			// Woken by the ticker, the two posts, the refusal's and the
			// rebuild's immediate next polls, with one of room.
			if most := int(elapsed/time.Second) + 6; polls > most {
				t.Errorf("%d polls in %v, want at most %d", polls, elapsed, most)
			}
			if want := pluginsandbox.DefaultRefusedAnswers + 1; tc.told && (told < 1 || told > want) || !tc.told && told != 0 {
				t.Errorf("the plugin was told %d times, want 1 to %d (told %v)", told, want, tc.told)
			}
			runningAndQuiet(t, ts, "instance was rebuilt", replies, fs)
		})
	}
}

// svcWebhook is the webhook example whose every poll answers the same
// message, past the default bound of a polled message's content, without
// reading the inbound queue: a plugin whose own service holds the message
// (unread mail) and answers it from any instance, a rebuilt one too.
const svcWebhook = `//go:build wasip1

package main

import (
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/channel"
)

type svc struct{ webhook }

func (svc) PollMessage() (*channel.Message, error) {
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "poll", Outcome: "started", Message: "svc poll"})
	return &channel.Message{ID: "svc-1", Sender: "ann", ThreadID: "t-1", Content: strings.Repeat("x", 1<<20+1)}, nil
}

func init() { channel.Register(svc{}) } // after main.go's init
`

// A plugin whose rebuilt instance answers the refused message again (its
// service, not its memory, holds it) is rebuilt once for it, no more: the
// sender is told once, the rebuild and what followed are logged once
// each, the binding's reason says the plugin's service holds the message,
// the polls stay at the interval, and a message posted behind it stays
// queued (accepted, not lost) until the plugin moves past it; the
// binding has failed.
func TestChannelPluginWhoseServiceHoldsItsRefusedMessageIsRebuiltOnce(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts, sink := stickyServer(t, fs, hook, svcWebhook, nil)
	start := time.Now()
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || r["thread_id"] != "t-1" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")
	const stuck = "channel plugin rebuilt for a message refused for its size answers it still"
	testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
		n := hostLogs(ts.logs, zapcore.WarnLevel, stuck)
		return int64(sink.count("svc poll")), n > 0
	})
	// Two more polls: nothing more is logged, nothing rebuilt.
	then := sink.count("svc poll")
	testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
		n := sink.count("svc poll")
		return int64(n), n >= then+2
	})
	elapsed := time.Since(start)
	polls := sink.count("svc poll")
	t.Logf("%d polls in %v", polls, elapsed)
	if most := int(elapsed/time.Second) + 6; polls > most {
		t.Errorf("%d polls in %v, want at most %d", polls, elapsed, most)
	}
	for msg, want := range map[string]int{
		"channel message refused: past the bound of a polled message":           1,
		"answered again a message refused for its size":                         1,
		"channel plugin rebuilt: it answered again and again a message refused": 1,
		stuck: 1,
	} {
		if n := hostLogs(ts.logs, zapcore.WarnLevel, msg); n != want {
			t.Errorf("%q logged %d times, want %d", msg, n, want)
		}
	}
	// The binding fails (channels_pollstall_test.go has what follows).
	stateAndQuiet(t, ts, "failed", "the plugin's own service holds it", replies, fs)
}

// runningAndQuiet checks that ts's one binding runs with a reason that
// holds reason, and that no reply and no prompt came since the test's
// last read of replies and fs.prompts.
func runningAndQuiet(t *testing.T, ts *testServer, reason string, replies <-chan map[string]string, fs *fakeSessions) {
	t.Helper()
	stateAndQuiet(t, ts, "running", reason, replies, fs)
}

// stateAndQuiet is runningAndQuiet for a binding in state.
func stateAndQuiet(t *testing.T, ts *testServer, state, reason string, replies <-chan map[string]string, fs *fakeSessions) {
	t.Helper()
	listed, err := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c := listed.GetChannels()[0]; c.GetState() != state || !strings.Contains(c.GetReason(), reason) {
		t.Errorf("binding %s: %q, want %s and %q", c.GetState(), c.GetReason(), state, reason)
	}
	select {
	case r := <-replies:
		t.Fatalf("a second reply: %v", r)
	case p := <-fs.prompts:
		t.Fatalf("a second prompt: %q", p.prompt)
	default:
	}
}
