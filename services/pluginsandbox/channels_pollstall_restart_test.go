package pluginsandbox_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// stalledAt binds ts's alias web to the held webhook, posts held-1 (past
// the poll's bound) and next, checks that held-1's sender is told, and
// waits for the binding to fail on it.
func stalledAt(t *testing.T, ts *testServer, sink *recordingSink, replies <-chan map[string]string) {
	t.Helper()
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postBad(t, web.Listen, "held-1", badBytes)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")
	waitFailed(t, ts, sink)
}

// waitFailed waits, as long as the plugin is polled, for ts's binding of
// web to fail.
func waitFailed(t *testing.T, ts *testServer, sink *recordingSink) {
	t.Helper()
	testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
		return int64(sink.count("held poll")), channelOf(t, ts, "web").GetState() == "failed"
	})
}

// noSecondReply fails t if held-1's sender was told again.
func noSecondReply(t *testing.T, replies <-chan map[string]string, after string) {
	t.Helper()
	select {
	case r := <-replies:
		t.Errorf("a second reply %s: %v", after, r)
	default:
	}
}

// heldOnTwoServers stalls a first server on the held guest (stalledAt),
// then starts a second on the same spool, binds web there and waits for
// it to fail on the message the first refused; closeFirst closes the
// first before the second starts (a restart), or leaves it running (a
// second replica). It gives the second server, the fake sessions both
// prompt and the upstream's replies.
func heldOnTwoServers(t *testing.T, closeFirst bool) (first, second *testServer, fs *fakeSessions, replies chan map[string]string) {
	t.Helper()
	hook, replies := replyHook(t)
	fs = newFakeSessions()
	spool := t.TempDir()
	onSpool := func(c *pluginsandbox.Config) { c.ChannelSpoolDir = spool }
	first, sink1 := stickyServer(t, fs, hook, heldWebhook, nil, onSpool)
	stalledAt(t, first, sink1, replies)
	if closeFirst {
		if err := first.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	second, sink2 := stickyServer(t, fs, hook, heldWebhook, nil, onSpool)
	bindChannels(t, second, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})
	waitFailed(t, second, sink2)
	return first, second, fs, replies
}

// upgradedDeliversNext upgrades ts's webhook plugin and checks that the
// message queued behind the held one is prompted.
func upgradedDeliversNext(t *testing.T, ts *testServer, fs *fakeSessions, after string) {
	t.Helper()
	upgradeWebhook(t, ts)
	ts.rescan(t)
	if p := testwait.Recv(t, fs.prompts); p.prompt != "next" {
		t.Fatalf("prompt %q %s, want next", p.prompt, after)
	}
}

// The sender of a message the host refused for its size, which the
// plugin's own service holds, was told again by the sandbox restarted
// on the same spool: what the binding knew of the message (heldKey)
// lived in the process. The spool now keeps it.
func TestStalledChannelsSenderIsNotToldAgainAfterARestart(t *testing.T) {
	_, ts2, fs, replies := heldOnTwoServers(t, true)
	noSecondReply(t, replies, "after the restart")

	// Nothing accepted was lost: the upgraded plugin delivers next.
	upgradedDeliversNext(t, ts2, fs, "after the upgrade")
	noSecondReply(t, replies, "after the upgrade")
}

// So was it by another replica of the alias polling the same plugin's
// service, which adopts the spool once the first one is gone.
func TestStalledChannelsSenderIsNotToldAgainByAReplicaAdoptingItsSpool(t *testing.T) {
	ts1, ts2, fs, replies := heldOnTwoServers(t, false)
	noSecondReply(t, replies, "from the second replica")

	// The first replica gone, the second adopts next and, upgraded,
	// delivers it.
	if err := ts1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	upgradedDeliversNext(t, ts2, fs, "after the adoption and the upgrade")
	noSecondReply(t, replies, "after the adoption")
}

// A post that passed the listener's check as the binding failed on a
// message its plugin's service holds was answered 202 after the
// failure, which counted it not among the messages waiting behind the
// held one. The hooks hold the post at the check until the failure
// begins: now it is queued before the failure, which counts it (or,
// after, it would be refused).
func TestPostAtTheInstantTheChannelFailsIsCountedByTheFailure(t *testing.T) {
	var armed atomic.Bool
	atCheck := make(chan struct{})
	failing := make(chan struct{})
	var once sync.Once
	counts := make(chan int, 16)
	undo := pluginsandbox.SetStallHooks(func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		close(atCheck)
		// A deadline to stop a hang, not a timing.
		select {
		case <-failing:
		case <-time.After(2 * time.Minute):
		}
	}, func() {
		once.Do(func() { close(failing) })
	}, func(queued int) {
		select {
		case counts <- queued:
		default:
		}
	})
	t.Cleanup(undo) // after the server's close: registered before it

	hook, replies := replyHook(t)
	fs := newFakeSessions()
	ts, _ := stickyServer(t, fs, hook, heldWebhook, nil)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postBad(t, web.Listen, "held-1", badBytes)
	if r := testwait.Recv(t, replies); r["recipient"] != "ann" {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	postText(t, web.Listen, "m2", "next")

	armed.Store(true)
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+web.Listen+"/",
			strings.NewReader(`{"id":"m3","from":"ann","thread":"t-1","text":"at the instant"}`))
		req.Header.Set("Authorization", "Bearer "+chanToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	testwait.Recv(t, atCheck)
	code := testwait.Recv(t, answered)
	queued := testwait.Recv(t, counts)
	switch {
	case code == http.StatusAccepted && queued != 2:
		t.Errorf("a post answered 202 at the instant the binding failed is not among the %d the failure counts waiting", queued)
	case code != http.StatusAccepted && code != http.StatusServiceUnavailable:
		t.Errorf("a post at the instant the binding failed: %d", code)
	}
	t.Logf("the post at the instant: %d; the failure counts %d waiting", code, queued)

	// Accepted, it is delivered after next once the plugin is upgraded.
	upgradeWebhook(t, ts)
	ts.rescan(t)
	want := []string{"next"}
	if code == http.StatusAccepted {
		want = append(want, "at the instant")
	}
	for _, w := range want {
		if p := testwait.Recv(t, fs.prompts); p.prompt != w {
			t.Fatalf("prompt %q after the upgrade, want %q", p.prompt, w)
		}
	}
}

// Two live replicas of the alias poll the same plugin's service. The
// one that read held-1 from its queue had the plugin hand it to its
// service before the host refused it; the other, polling that service
// between then and the first one's mark, met a refusal nobody had marked
// and told the sender, and the first told it again. The hook holds the
// first at that instant until the other has told: now exactly one does.
func TestStalledChannelsSenderIsToldOnceByTwoReplicasAtTheInstant(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	release := make(chan struct{})
	undo := pluginsandbox.SetRefusalHook(func(read int) {
		if read == 0 || !armed.CompareAndSwap(true, false) {
			return
		}
		// A deadline to stop a hang, not a timing.
		select {
		case <-release:
		case <-time.After(2 * time.Minute):
		}
	})
	t.Cleanup(undo) // after the servers' close: registered before them

	hook, replies := replyHook(t)
	fs := newFakeSessions()
	spool := t.TempDir()
	onSpool := func(c *pluginsandbox.Config) { c.ChannelSpoolDir = spool }
	first, sink1 := stickyServer(t, fs, hook, heldWebhook, nil, onSpool)
	second, sink2 := stickyServer(t, fs, hook, heldWebhook, nil, onSpool)
	bound := pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"}
	web := bindChannels(t, first, bound)["web"]
	bindChannels(t, second, bound)

	postBad(t, web.Listen, "held-1", badBytes)
	// The first is held at its refusal; the second meets the message
	// in the plugin's service and tells its sender. Waited for as long
	// as the second polls: a minute's bound alone was passed once at a
	// load of 35 (three -race suites on two cores).
	var r map[string]string
	testwait.Progress(t, 50*time.Millisecond, func() (int64, bool) {
		select {
		case r = <-replies:
			return 0, true
		default:
			return int64(sink2.count("held poll")), false
		}
	})
	if r["recipient"] != "ann" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the poll's bound: %v", r)
	}
	close(release)
	waitFailed(t, first, sink1)
	waitFailed(t, second, sink2)
	noSecondReply(t, replies, "from the replica that read it from its queue")
}
