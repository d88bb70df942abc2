package e2e_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/channelhook"
)

// A channel's senders cannot take the operator's open sessions: every
// conversation (thread, else sender) opened an operator session and
// nothing closed one, so a holder of the channel's token who wrote on
// 1000 threads left the operator at the session service's open-session
// cap (1000 a principal), and the operator's own session/new, and every
// other channel's new conversation, failed. A channel keeps at most
// channels.plugin.<alias>.max_sessions conversations open, closing the
// least recently active idle one (closed, not deleted: its next message
// reopens it with its history).
func TestPluginChannelConversationsLeaveTheOperatorSessions(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
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

	bindWebChannel(t, v, hookURL)
	listen := webChannelListen(t, v, "")
	post := func(thread, text string) {
		t.Helper()
		body := fmt.Sprintf(`{"id":"m-%s-%s","from":"ann","text":%q,"thread":%q}`, thread, text, text, thread)
		for {
			req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewBufferString(body))
			req.Header.Set("Authorization", "Bearer "+webChannelToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusAccepted:
				return
			case http.StatusServiceUnavailable: // the queue is full
				time.Sleep(50 * time.Millisecond)
			default:
				t.Fatalf("a message on %s: %s", thread, resp.Status)
			}
		}
	}
	answered := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(replies) >= n
		}
	}

	// One more thread than the session service keeps open for a principal.
	const threads = 1001
	for i := range threads {
		post(fmt.Sprintf("t-%d", i), "/say hi")
	}
	waitFor(t, "an answer on every thread", 10*time.Minute, answered(threads))

	// The operator still opens a session of its own.
	var r struct {
		SessionID string `json:"session_id"`
	}
	_, f := v.until(v.send("session/new", map[string]any{}))
	if f.Error != nil {
		t.Fatalf("the operator's session/new after %d channel conversations: %v", threads, f.Error)
	}
	_ = json.Unmarshal(f.Result, &r)

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
	if open > 256 {
		t.Fatalf("%d channel conversations left open, want at most 256 (channels.plugin.web.max_sessions)", open)
	}

	// The first thread's session was closed to make room; its next
	// message reopens it with its history.
	post("t-0", "/say again")
	waitFor(t, "the answer on the first thread again", 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return replies["t-0"] >= 2
	})
	sum := sha256.Sum256([]byte("web\x00webhook\x00default\x00t-0"))
	id := "chan_" + hex.EncodeToString(sum[:16])
	var msgs struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(v.call("session/messages", map[string]any{"session_id": id}), &msgs); err != nil {
		t.Fatal(err)
	}
	if len(msgs.Messages) < 4 || msgs.Messages[0].Content != "/say hi" || msgs.Messages[2].Content != "/say again" {
		t.Fatalf("the first thread's transcript after its session was closed and reopened: %+v", msgs.Messages)
	}
}
