package pluginsandbox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// hostileWordWebhook is the webhook example whose channel takes the word
// of a refusal (channel_poll_refused) with body, and logs each poll.
func hostileWordWebhook(body string) string {
	return `//go:build wasip1

package main

import (
	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/channel"
)

type hostile struct{ webhook }

func (h hostile) PollMessage() (*channel.Message, error) {
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "poll", Outcome: "started", Message: "hostile poll"})
	return h.webhook.PollMessage()
}

func (h hostile) PollRefused(r channel.Refusal) error {
` + body + `
}

var _ = pdk.Log

func init() { channel.Register(hostile{}) } // after main.go's init
`
}

// A plugin whose word of a refusal fails (it panics at every word, or
// loops until its fuel is spent) or reads the inbound queue, as it must
// not there, leaves the binding as a plugin that takes the word does:
// the refused message's sender is told once, the refusal logged once
// (saying the plugin was not told, and why), the instance rebuilt at the
// next poll, the message queued behind it delivered, and the channel
// polled at its interval after, no faster.
func TestChannelPluginHostileToTheRefusalWordGoesOn(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		told       bool
		tellErr    string
	}{
		{name: "panics", body: `	panic("refused: " + r.ID)`, tellErr: "guest trapped"},
		{name: "loops", body: `	for {
	}`, tellErr: "out of fuel"},
		{name: "reads the inbound queue", told: true, body: `	m, err := h.webhook.PollMessage()
	msg := "the queue read empty"
	if m != nil || err != nil {
		msg = "the queue read a message"
	}
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "poll", Outcome: "denied", Message: msg})
	return nil`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook, replies := replyHook(t)
			fs := newFakeSessions()
			ts, sink := stickyServer(t, fs, hook, hostileWordWebhook(tc.body), nil)
			start := time.Now()
			web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
			if web.GetState() != "running" {
				t.Fatalf("binding %s: %q", web.GetState(), web.GetReason())
			}

			// The next message posted at once: it may be queued when
			// the plugin is told, and is not the word's to take.
			postBad(t, web.Listen, "m1", badBytes)
			postText(t, web.Listen, "m2", "next")
			if r := testwait.Recv(t, replies); r["recipient"] != "ann" || !strings.Contains(r["content"], "not delivered") {
				t.Fatalf("reply to a message past the poll's bound: %v", r)
			}
			if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
				t.Fatalf("prompt of %d bytes (%.40q), want next", len(p.prompt), p.prompt)
			}
			// Polled on after, with nothing posted: two more polls, and
			// no more than the ticker's since the binding started, the
			// two posts', the immediate next polls after the refusal
			// and after the delivered message, and one of room. The
			// plugin's records reach the sink from the host's queue, so
			// the count is taken from the start, not from here.
			before := sink.count("hostile poll")
			testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
				n := sink.count("hostile poll")
				return int64(n), n >= before+2
			})
			elapsed := time.Since(start)
			if polls, most := sink.count("hostile poll"), int(elapsed/time.Second)+6; polls > most {
				t.Fatalf("%d polls in %v: want at most %d", polls, elapsed, most)
			}
			t.Logf("%d polls in %v", sink.count("hostile poll"), elapsed)

			entries := ts.logs.FilterMessage("channel message refused: past the bound of a polled message").All()
			if len(entries) != 1 {
				t.Fatalf("the refusal logged %d times, want once", len(entries))
			}
			fields := entries[0].ContextMap()
			if fields["plugin_told"] != tc.told || !strings.Contains(fmt.Sprint(fields["tell_error"]), tc.tellErr) || (tc.tellErr == "") != (fields["tell_error"] == nil) {
				t.Errorf("the refusal's log: plugin_told %v, tell_error %v; want %v, %q", fields["plugin_told"], fields["tell_error"], tc.told, tc.tellErr)
			}
			if n := hostLogs(ts.logs, zapcore.WarnLevel, "answered again a message refused"); n != 0 {
				t.Errorf("%d warnings of a message answered again", n)
			}
			if tc.told {
				testwait.Progress(t, 10*time.Millisecond, func() (int64, bool) {
					n := sink.count("the queue read empty") + sink.count("the queue read a message")
					return int64(n), n > 0
				})
				if n := sink.count("the queue read a message"); n != 0 {
					t.Errorf("the word read %d messages from the inbound queue", n)
				}
			}
			runningAndQuiet(t, ts, "", replies, fs)
		})
	}
}
