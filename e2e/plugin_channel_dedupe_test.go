package e2e_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/channelhook"
)

// channelToolRows counts the rows of tool's results in the transcript of
// the channel session sessionID.
func channelToolRows(t *testing.T, v *conv, sessionID, tool string) int {
	t.Helper()
	var msgs struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(v.call("session/messages", map[string]any{"session_id": sessionID}), &msgs); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range msgs.Messages {
		if m.Role == "tool" && strings.HasPrefix(m.Content, tool+":") {
			n++
		}
	}
	return n
}

// channelSessionID waits for the one channel session and returns its id.
func channelSessionID(t *testing.T, v *conv) string {
	t.Helper()
	var id string
	waitFor(t, "the channel's session", 30*time.Second, func() bool {
		var list struct {
			Sessions []map[string]any `json:"sessions"`
		}
		_ = json.Unmarshal(v.call("session/list", map[string]any{}), &list)
		for _, sess := range list.Sessions {
			if s, _ := sess["session_id"].(string); strings.HasPrefix(s, "chan_") {
				id = s
				return true
			}
		}
		return false
	})
	return id
}

// A channel turn cut by a rebind after its tool ran is delivered again,
// and the tool does not run a second time: the message's idempotency key
// names its turn, and the redelivery resumes that turn (the provider is
// given the call and its result) rather than starting the message over.
// Without it the redelivered turn ran the tool again: a side-effecting
// tool (a payment, a post) acted twice for one message.
func TestPluginChannelRedeliveryRunsNoToolTwice(t *testing.T) {
	t.Parallel()
	_, v, listen, replies := webChannelStack(t, true)
	text := "/tool " + echoTool + ` {"msg":"paid once"}` + "\n/sleep 4000\n/say done after the rebind"
	body, _ := json.Marshal(map[string]string{"id": "m1", "from": "ann", "text": text, "thread": "t-1"})
	postWebMessage(t, listen, body)
	id := channelSessionID(t, v)
	// The tool ran; the turn sleeps in its next step when the binding moves.
	waitFor(t, "the tool's result", 30*time.Second, func() bool { return channelToolRows(t, v, id, echoTool) == 1 })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	moved := lis.Addr().String()
	lis.Close()
	v.call("config/set", map[string]any{"prop": "channels.plugin.web.listen", "value": moved})
	webChannelListen(t, v, listen)
	waitFor(t, "the answer of the cut turn", 60*time.Second, func() bool { return len(replies()) > 0 })
	got := replies()
	if !strings.HasSuffix(got[0], "done after the rebind") {
		t.Fatalf("replies %q, want the cut turn's answer", got)
	}
	if n := channelToolRows(t, v, id, echoTool); n != 1 {
		t.Fatalf("the tool ran %d times for one message, want once", n)
	}
}

// An alias's max_sessions holds for the whole channel, not per sandbox
// replica: two replicas share the channel's listener, and each closed
// conversations past the bound only among those it had opened itself, so
// the alias kept up to twice its bound open.
func TestPluginChannelMaxSessionsHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	const max, threads = 8, 48
	s := pluginStack(t, []string{"webhook"}, "--scale", "plugin-sandbox=2",
		"--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8",
		"--set", fmt.Sprintf("channels.plugin.web.max_sessions=%d", max))
	v := newConv(t, s, nil)

	var (
		mu      sync.Mutex
		replies = map[string]int{}
	)
	hookURL := channelhook.Serve(t, func(r channelhook.Reply) {
		mu.Lock()
		replies[r.Body["thread_id"]]++
		mu.Unlock()
	})
	listen := bindWebChannelOnBothReplicas(t, s, v, hookURL)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range threads {
		body := fmt.Sprintf(`{"id":"m-%d","from":"ann","text":"/say hi","thread":"t-%d"}`, i, i)
		for {
			req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+webChannelToken)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				break
			}
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("thread %d: %s", i, resp.Status)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(t, "an answer on every thread", 3*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) >= threads
	})
	for i, l := range replicaLogs(s, 2) {
		if !strings.Contains(readFile(l), `"channel message handed to a session"`) {
			t.Fatalf("replica %d delivered nothing: the test did not spread the threads", i)
		}
	}
	var list struct {
		Sessions []map[string]any `json:"sessions"`
	}
	if err := json.Unmarshal(v.call("session/list", map[string]any{"limit": 1000}), &list); err != nil {
		t.Fatal(err)
	}
	open := 0
	for _, sess := range list.Sessions {
		if id, _ := sess["session_id"].(string); strings.HasPrefix(id, "chan_") {
			open++
		}
	}
	if open > max {
		t.Fatalf("%d conversations of channel web open over two replicas, want at most %d (its max_sessions)", open, max)
	}
}

// readFile is path's text, empty when it cannot be read.
func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// Two messages of one conversation whose ids and texts joined with a NUL
// are the same ("m\x00x" + "/say one" and "m" + "x\x00/say one") had one
// idempotency key: the second was answered with the first's turn
// (replayed), and the agent never read it. A plugin's id may no longer
// hold a control character: the first is refused, its sender told, and
// the second gets a turn of its own.
func TestPluginChannelIDWithNULMeetsNoOtherMessage(t *testing.T) {
	t.Parallel()
	_, _, listen, replies := webChannelStack(t, false)
	for _, m := range []map[string]string{
		{"id": "m\x00x", "from": "ann", "text": "/say one", "thread": "t-1"},
		{"id": "m", "from": "ann", "text": "x\x00/say one", "thread": "t-1"},
	} {
		body, _ := json.Marshal(m)
		postWebMessage(t, listen, body)
	}
	waitFor(t, "both messages answered", 60*time.Second, func() bool { return len(replies()) >= 2 })
	got := replies()
	own, told := false, false
	for _, r := range got {
		own = own || strings.HasPrefix(r, "x")
		told = told || strings.Contains(r, "its id")
	}
	if !own || !told {
		t.Fatalf("replies %q, want the second message's own answer and a notice for the first", got)
	}
}
