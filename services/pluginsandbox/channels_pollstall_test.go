package pluginsandbox_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/testwait"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// heldWebhook is the sticky guest of channels_pollrefused_test.go in
// its "own service holds it" form: a message whose id starts with
// "held" is kept, once answered, by the plugin's upstream service (the
// webhook's URL, /hold) rather than in its memory, and every poll asks
// that service first (/held) and answers what it holds without reading
// the host's queue. It stands for a mail channel whose server keeps a
// message unread whatever the plugin is told: a rebuilt instance asks
// the server again and answers it again. Its source is
// internal/guestbuild/testdata/webhook_held.go.txt.
var heldWebhook = func() string {
	src, err := channelhook.HeldWebhookSource()
	if err != nil {
		panic(err)
	}
	return src
}()

// channelOf is ts's binding of alias as listed.
func channelOf(t *testing.T, ts *testServer, alias string) *pluginv1.Channel {
	t.Helper()
	listed, err := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range listed.GetChannels() {
		if c.GetAlias() == alias {
			return c
		}
	}
	t.Fatalf("no binding %s in %v", alias, listed.GetChannels())
	return nil
}

// postStatus posts id's message text from ann on thread t-1 and returns
// the status and the body of the answer.
func postStatus(t *testing.T, addr, id, text string) (int, string) {
	t.Helper()
	a := postAnswer(t, addr, `{"id":"`+id+`","from":"ann","thread":"t-1","text":"`+text+`"}`)
	return a.code, a.body
}

// A plugin whose own service holds a message the host refused for its
// size answers it again from the instance rebuilt for it: the channel
// stalled for good with the binding "running", the messages accepted
// (202) behind the refused one were never delivered, and new posts were
// still answered 202, to wait behind it too. Now the binding fails once
// the rebuilt instance answers it again: plugins/list says so and why,
// the listener refuses new posts (503, saying why) instead of accepting
// what it cannot deliver, a rebind of the same plugin does not tell the
// refused message's sender a second time, and what was accepted before
// the stall is delivered once the plugin is upgraded.
func TestChannelPluginWhoseServiceHoldsItsRefusedMessageFailsTheBinding(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts, sink := stickyServer(t, fs, hook, heldWebhook, nil)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	postBad(t, web.Listen, "held-1", badBytes)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || r["thread_id"] != "t-1" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")
	told, polled := time.Now(), sink.count("held poll")

	// failed waits for the binding to fail, as long as the plugin is
	// polled; it reports false when the stall was final (logged) but
	// the binding did not fail.
	const stuck = "channel plugin rebuilt for a message refused for its size answers it still"
	failed := func(logged int) bool {
		var c *pluginv1.Channel
		testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
			c = channelOf(t, ts, "web")
			return int64(sink.count("held poll")), c.GetState() == "failed" || hostLogs(ts.logs, zapcore.WarnLevel, stuck) >= logged
		})
		if c.GetState() != "failed" || !strings.Contains(c.GetReason(), "own service holds it") {
			t.Errorf("binding %s: %q, want failed because the plugin's own service holds the message", c.GetState(), c.GetReason())
			return false
		}
		return true
	}
	if failed(1) {
		t.Logf("failed %v after its sender was told, %d polls later", time.Since(told), sink.count("held poll")-polled)
	}
	code, body := postStatus(t, web.Listen, "m3", "after the stall")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "refused for its size") {
		t.Errorf("a post to the stalled channel: %d %q, want 503 saying why", code, strings.TrimSpace(body))
	}
	select {
	case p := <-fs.prompts:
		t.Fatalf("a prompt while the channel is stalled: %q", p.prompt)
	default:
	}

	// A rebind of the same plugin hands the queue over; the plugin's
	// service still holds the message: the binding fails again, its
	// sender not told again.
	web = bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "other"})["web"]
	failed(2)
	select {
	case r := <-replies:
		t.Errorf("a second reply after the rebind: %v", r)
	default:
	}

	// The plugin upgraded (here to the webhook example, which keeps no
	// message in a service): what was accepted before the stall is
	// delivered, and the channel takes messages again.
	upgradeWebhook(t, ts)
	ts.rescan(t)
	if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
		t.Fatalf("prompt %q after the upgrade, want next", p.prompt)
	}
	if c := channelOf(t, ts, "web"); c.GetState() != "running" {
		t.Errorf("binding after the upgrade %s: %q", c.GetState(), c.GetReason())
	}
	if code, body := postStatus(t, channelOf(t, ts, "web").GetListen(), "m4", "after the upgrade"); code != http.StatusAccepted {
		t.Errorf("a post after the upgrade: %d %q", code, body)
	}
	if p := testwait.Recv(t, fs.prompts); p.prompt != "after the upgrade" {
		t.Fatalf("prompt %q, want the one posted after the upgrade", p.prompt)
	}
}

// upgradeWebhook installs the webhook example over ts's webhook plugin
// (a new module: the next scan loads it as an upgrade).
func upgradeWebhook(t *testing.T, ts *testServer) {
	t.Helper()
	wasm, err := guestbuild.Wasm("webhook")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(wasm)
	if err == nil {
		err = os.WriteFile(filepath.Join(ts.dir, "webhook", "plugin.wasm"), data, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A channel failed on a message its plugin's service holds, then
// unbound, leaves what it accepted before the stall in its spool, says
// so, and a binding of the alias to the plugin, upgraded meanwhile,
// delivers it: nothing accepted is dropped, nor its sender left untold
// without a word in the log.
func TestStalledChannelUnboundLeavesItsMessagesToTheNextBinding(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	spool := t.TempDir()
	ts, _ := stickyServer(t, fs, hook, heldWebhook, nil, func(c *pluginsandbox.Config) { c.ChannelSpoolDir = spool })
	bound := pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"}
	web := bindChannels(t, ts, bound)["web"]

	postBad(t, web.Listen, "held-1", badBytes)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")
	testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
		return int64(len(ts.logs.All())), channelOf(t, ts, "web").GetState() == "failed"
	})

	bindChannels(t, ts)
	const left = "channel messages left in the spool by their binding"
	if n := hostLogs(ts.logs, zapcore.WarnLevel, left); n != 1 {
		t.Errorf("%q logged %d times, want once", left, n)
	}
	files, err := filepath.Glob(filepath.Join(spool, "*", "*", "*", "*.msg"))
	if err != nil || len(files) != 1 {
		t.Errorf("the spool after the unbind holds %v (%v), want next's file", files, err)
	}

	upgradeWebhook(t, ts)
	bindChannels(t, ts, bound)
	if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
		t.Fatalf("prompt %q after the upgrade, want next", p.prompt)
	}
	select {
	case r := <-replies:
		t.Errorf("a second reply: %v", r)
	default:
	}
}

// A binding failed on a message its plugin's service holds had its
// plugin polled once a second for as long as it stayed failed (a call of
// the plugin's service a second, for days): the poll is what lets it
// recover by itself, not what it needs once a second. It backs off now:
// the wait doubles from two poll intervals to a bound (here lowered to
// 4 s, 60 s by default), each poll of the plugin waits for it (nothing
// else wakes one), and a rebind starts it over.
func TestStalledChannelsPluginIsPolledLessAndLess(t *testing.T) {
	type wake struct {
		wait  time.Duration
		at    time.Time
		polls int
	}
	var mu sync.Mutex
	var wakes []wake
	var sinkOf atomic.Pointer[recordingSink]
	undoHook := pluginsandbox.SetStalledPollHook(func(wait time.Duration) {
		w := wake{wait: wait, at: time.Now()}
		if s := sinkOf.Load(); s != nil {
			w.polls = s.count("held poll")
		}
		mu.Lock()
		wakes = append(wakes, w)
		mu.Unlock()
	})
	t.Cleanup(undoHook) // after the server's close: registered before it
	t.Cleanup(pluginsandbox.SetStalledPollBound(4 * time.Second))
	// taken waits for n wakes and takes them; failed, it fails t if the
	// plugin was polled more than n+2 times meanwhile.
	taken := func(sink *recordingSink, n int, failed bool) []wake {
		var got []wake
		from := sink.count("held poll")
		testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
			mu.Lock()
			defer mu.Unlock()
			got = append([]wake(nil), wakes...)
			polls := sink.count("held poll")
			if failed && len(got) < n && polls-from > n+2 {
				t.Fatalf("the failed binding's plugin polled %d times with %d waits set: polled at the interval, not its backoff", polls-from, len(got))
			}
			return int64(polls), len(got) >= n
		})
		return got[:n]
	}
	// spaced checks that each poll of got came no sooner than the wait
	// the one before set, and that the plugin was polled about once a
	// wait. The count is of the guest's log lines, which reach the sink
	// on their own time: one may be counted at the wake after its poll's,
	// so the polls are counted over the whole run of wakes, one late line
	// allowed, not wake by wake (CI: "polled 0 times since the one
	// before" then 2). A plugin polled at the interval instead of its
	// backoff is polled about four times a wait here.
	spaced := func(got []wake) []time.Duration {
		var gaps []time.Duration
		for i := 1; i < len(got); i++ {
			gap := got[i].at.Sub(got[i-1].at)
			gaps = append(gaps, gap.Round(time.Millisecond))
			if gap < got[i-1].wait {
				t.Errorf("poll %d while failed came %v after the one before, which set a wait of %v", i, gap, got[i-1].wait)
			}
		}
		if n, waits := got[len(got)-1].polls-got[0].polls, len(got)-1; n > waits+1 {
			t.Errorf("the plugin polled %d times over %d waits while failed, want about once a wait", n, waits)
		}
		return gaps
	}

	hook, replies, away := replyHookAway(t)
	fs := newFakeSessions()
	ts, sink := stickyServer(t, fs, hook, heldWebhook, nil)
	sinkOf.Store(sink)
	stalledAt(t, ts, sink, replies)
	got := taken(sink, 5, true)
	var waits []time.Duration
	for _, w := range got {
		waits = append(waits, w.wait)
	}
	if want := []time.Duration{2 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}; !slices.Equal(waits, want) {
		t.Errorf("waits while failed %v, want %v", waits, want)
	}
	t.Logf("waits while failed %v, the polls' gaps %v", waits, spaced(got))

	// The plugin's service away, its polls fail: still at the backoff.
	mu.Lock()
	wakes = nil
	mu.Unlock()
	away.Store(true)
	got = taken(sink, 3, true)
	t.Logf("with its service away, the polls' gaps %v", spaced(got))
	away.Store(false)

	// A rebind (another agent) hands the queue over; the new binding
	// fails again, and its backoff starts over.
	mu.Lock()
	wakes = nil
	mu.Unlock()
	bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "other"})
	if w := taken(sink, 1, false)[0]; w.wait != 2*time.Second {
		t.Errorf("the first wait after the rebind failed again: %v, want 2s", w.wait)
	}
	noSecondReply(t, replies, "after the rebind")
	if c := channelOf(t, ts, "web"); !strings.Contains(c.GetReason(), "doubling") {
		t.Errorf("the failed binding's reason does not say how it is polled: %q", c.GetReason())
	}
}
