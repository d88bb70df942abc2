package pluginsandbox_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// badBytes is how many invalid UTF-8 bytes the posted text of these tests
// holds: the webhook plugin decodes each to U+FFFD, three bytes, so a
// body the listener takes (1 MiB at most) polls as a message whose
// content is past the default 1 MiB a polled message may carry.
const badBytes = 360 << 10

// postBad posts id's message from ann on thread t-1 whose text is n
// invalid bytes, and checks it was answered 202.
func postBad(t *testing.T, addr, id string, n int) {
	t.Helper()
	body := `{"id":"` + id + `","from":"ann","thread":"t-1","text":"` + strings.Repeat("\xff", n) + `"}`
	if code := postMessage(t, addr, body); code != http.StatusAccepted {
		t.Fatalf("post %s (%d bytes): %d", id, len(body), code)
	}
}

// postText posts id's message text from ann on thread t-1 (postThread's
// id is its text, which past 256 bytes is refused for the id).
func postText(t *testing.T, addr, id, text string) {
	t.Helper()
	if code := postMessage(t, addr, `{"id":"`+id+`","from":"ann","thread":"t-1","text":"`+text+`"}`); code != http.StatusAccepted {
		t.Fatalf("post %s: %d", id, code)
	}
}

// A message the plugin polls past the host's bound (here the webhook
// example turns a 369 KB body into 1,105,920 bytes of content, past the
// 1 MiB a polled message may carry) was refused and dropped, its spool
// files with it: its sender, answered 202, never heard of it again (the
// channel went on with the next message; the refusal was a "channel poll
// failed" warning). Its sender is now told that it was not delivered,
// with its size and the bound, on its thread.
func TestChannelMessagePastThePollBoundGetsANotice(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts := channelServerHook(t, fs, hook)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	postBad(t, web.Listen, "m1", badBytes)
	r := testwait.Recv(t, replies)
	want := fmt.Sprintf("not delivered: it is %d bytes long, and this channel takes messages of at most %d bytes", 3*badBytes, 1<<20)
	if r["recipient"] != "ann" || r["thread_id"] != "t-1" || !strings.Contains(r["content"], want) {
		t.Fatalf("reply to a message past the poll's bound: %v, want ann told on t-1 %q", r, want)
	}
	// The channel goes on; the refused message never reaches a session.
	postThread(t, web.Listen, "t-1", "next")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
		t.Fatalf("prompt of %d bytes (%.40q), want next", len(p.prompt), p.prompt)
	}
	select {
	case r := <-replies:
		t.Fatalf("a second reply: %v", r)
	default:
	}
}

// The bound of a polled message's content is the alias's
// channels.plugin.<alias>.max_content_kb: a plugin that fetches its
// messages itself may bring larger ones than the listener takes, and
// every one past 1 MiB was refused, whatever the operator wanted. Within
// the setting the message is delivered whole; past a smaller setting it
// is refused and its sender told the setting's bound.
func TestChannelContentBoundFromConfig(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts := channelServerHook(t, fs, hook)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", MaxContentKB: 2048})["web"]
	postBad(t, web.Listen, "m1", badBytes)
	if p := testwait.Recv(t, fs.prompts); p.prompt != strings.Repeat("\uFFFD", badBytes) {
		t.Fatalf("prompt of %d bytes, want the message's %d", len(p.prompt), 3*badBytes)
	}

	web = bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", MaxContentKB: 1})["web"]
	postText(t, web.Listen, "m2", strings.Repeat("x", 1025))
	var r map[string]string
	select {
	case r = <-replies:
	case p := <-fs.prompts:
		t.Fatalf("a message past max_content_kb 1 delivered: a prompt of %d bytes", len(p.prompt))
	case <-time.After(testwait.Bound):
		for _, e := range ts.logs.All() {
			t.Logf("%s %v", e.Message, e.ContextMap())
		}
		t.Fatal("no reply to a message past max_content_kb 1")
	}
	if !strings.Contains(r["content"], "it is 1025 bytes long, and this channel takes messages of at most 1024 bytes") {
		t.Fatalf("reply to a message past max_content_kb 1: %v", r)
	}
	postText(t, web.Listen, "m3", strings.Repeat("y", 1024))
	if p := testwait.Recv(t, fs.prompts); p.prompt != strings.Repeat("y", 1024) {
		t.Fatalf("prompt of %d bytes, want the 1024 of the message at the bound", len(p.prompt))
	}

	// A binding past the hard maximum (8 MiB) fails, naming the setting.
	c := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", MaxContentKB: 8193})["web"]
	if c == nil || c.State != "failed" || !strings.Contains(c.Reason, "max_content_kb 8193: a message's content is 1 to 8192 KiB") {
		t.Fatalf("a binding whose max_content_kb is 8193: %v", c)
	}
}

// max_content_kb is read from the config revision, its default the
// listener's 1 MiB.
func TestLiveReadsMaxContentKB(t *testing.T) {
	for _, tc := range []struct {
		doc  map[string]any
		want int
	}{
		{map[string]any{"web": map[string]any{"plugin": "webhook"}}, 1024},
		{map[string]any{"web": map[string]any{"plugin": "webhook", "max_content_kb": float64(4096)}}, 4096},
	} {
		l, err := pluginsandbox.LiveFrom(configclient.Snapshot{Document: map[string]any{"channels": map[string]any{"plugin": tc.doc}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Channels["web"].MaxContentKB; got != tc.want {
			t.Errorf("%v: max_content_kb %d, want %d", tc.doc, got, tc.want)
		}
	}
}

// refused_answers is read from the config revision, its default 3.
func TestLiveReadsRefusedAnswers(t *testing.T) {
	for _, tc := range []struct {
		doc  map[string]any
		want int
	}{
		{map[string]any{"web": map[string]any{"plugin": "webhook"}}, pluginsandbox.DefaultRefusedAnswers},
		{map[string]any{"web": map[string]any{"plugin": "webhook", "refused_answers": float64(10)}}, 10},
	} {
		l, err := pluginsandbox.LiveFrom(configclient.Snapshot{Document: map[string]any{"channels": map[string]any{"plugin": tc.doc}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Channels["web"].RefusedAnswers; got != tc.want {
			t.Errorf("%v: refused_answers %d, want %d", tc.doc, got, tc.want)
		}
	}
}
