package pluginsandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// A plugin that answers a message refused for its size again at its next
// poll, without reading the inbound queue (one that moves past a message
// of its service only once the host took it), would have its sender told
// at every poll, once a second. The sender is told once; the binding's
// reason says the channel is stalled until the plugin answers something
// else, and a message read from the queue again is a new one.
func TestPollRefusedTellsItsSenderOnce(t *testing.T) {
	b := &binding{log: zap.NewNop(), dl: &deliveries{notices: make(chan backlogNotice, 8)}}
	b.set(channelRunning, "")
	r := &wasmhost.PollRefusedError{Field: "content", Size: 2 << 20, Bound: 1 << 20,
		Msg: &wasmhost.ChannelMessage{ID: "m1", Sender: "ann", ThreadID: "t"}}
	var p pollRefusals
	ctx := context.Background()
	told := func(want int) {
		t.Helper()
		if got := len(b.dl.notices); got != want {
			t.Fatalf("%d notices, want %d", got, want)
		}
	}
	reason := func(want string) {
		t.Helper()
		if state, got := b.status(); state != channelRunning || !strings.Contains(got, want) || want == "" && got != "" {
			t.Fatalf("binding %s (%q), want running with %q", state, got, want)
		}
	}

	if !b.pollRefused(ctx, r, nil, time.Now(), &p) {
		t.Fatal("a first refusal is no new message")
	}
	told(1)
	reason("")
	if n := <-b.dl.notices; n.msg != r.Msg || !strings.Contains(n.text, "it is 2097152 bytes long, and this channel takes messages of at most 1048576 bytes") {
		t.Fatalf("notice %q to %+v", n.text, n.msg)
	}
	for range DefaultRefusedAnswers - 1 { // the next one rebuilds the instance: none here
		if b.pollRefused(ctx, r, nil, time.Now(), &p) {
			t.Fatal("the same message answered again is a new one")
		}
	}
	told(0)
	reason("the channel takes no message until the plugin moves past it")

	// The same message read from the queue again is another post of it.
	if !b.pollRefused(ctx, r, []string{"file"}, time.Now(), &p) {
		t.Fatal("a message read from the queue is no new message")
	}
	told(1)
	reason("")

	// Once the plugin answered something else, it is new again.
	p.clear(b)
	if !b.pollRefused(ctx, r, nil, time.Now(), &p) {
		t.Fatal("a refusal after another answer is no new message")
	}
	told(2)
	other := &wasmhost.PollRefusedError{Field: "sender", Size: 20 << 10, Bound: 16 << 10, Msg: &wasmhost.ChannelMessage{ID: "m2"}}
	if !b.pollRefused(ctx, other, nil, time.Now(), &p) {
		t.Fatal("another refused message is no new one")
	}
	<-b.dl.notices
	<-b.dl.notices
	if n := <-b.dl.notices; n.text != "This message was not delivered: its sender is 20480 bytes long, and this channel takes at most 16384." {
		t.Fatalf("notice %q", n.text)
	}
}

// refused_answers sets how many answers again of a refused message the
// host waits for before it rebuilds the plugin's instance (3 when unset,
// 1 to 60); it was a constant.
func TestRefusedAnswersAreTheBindingsSetting(t *testing.T) {
	b := &binding{cfg: ChannelBinding{RefusedAnswers: 5}, log: zap.NewNop(), dl: &deliveries{notices: make(chan backlogNotice, 8)}}
	b.set(channelRunning, "")
	r := &wasmhost.PollRefusedError{Field: "content", Size: 2 << 20, Bound: 1 << 20, Msg: &wasmhost.ChannelMessage{ID: "m1"}}
	var p pollRefusals
	b.pollRefused(context.Background(), r, nil, time.Now(), &p)
	// With the constant, the third answer again rebuilt the instance
	// (here a nil channel's, which panics).
	for range 4 {
		b.pollRefused(context.Background(), r, nil, time.Now(), &p)
	}
	if p.rebuilt || p.again != 4 {
		t.Fatalf("after 4 answers again with refused_answers 5: rebuilt %v, again %d", p.rebuilt, p.again)
	}
	if _, reason := b.status(); !strings.Contains(reason, "rebuilt at the 6-th answer") {
		t.Fatalf("reason %q, want the rebuild at the 6-th answer", reason)
	}
	for _, n := range []int{-1, 61} {
		err := ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", RefusedAnswers: n}.validate()
		if err == nil || !strings.Contains(err.Error(), "channels.plugin.web.refused_answers") {
			t.Errorf("refused_answers %d: %v, want refused naming the setting", n, err)
		}
	}
	if err := (ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0"}).validate(); err != nil {
		t.Errorf("refused_answers unset: %v", err)
	}
}
