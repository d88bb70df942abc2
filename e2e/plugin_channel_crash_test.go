package e2e_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A sandbox replica killed while it held channel messages it had answered
// 202 for (one in its turn, one waiting behind it in its conversation)
// lost them without a word: no answer, no notice, nothing in the log of
// the replica that followed. The listener now keeps each accepted message
// on disk until it is answered or its sender told, and the replica that
// follows (here the same one, restarted) delivers what the dead one held.
func TestPluginChannelMessagesOutliveAReplicaKill(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)

	var (
		mu      sync.Mutex
		replies []string
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		replies = append(replies, body["content"])
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	bindWebChannel(t, v, hook.URL)
	listen := webChannelListen(t, v, "")
	for _, body := range []string{
		`{"id":"m1","from":"ann","text":"/sleep 5000\n/say first after the kill","thread":"t-1"}`,
		`{"id":"m2","from":"ann","text":"/say second after the kill","thread":"t-1"}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer "+webChannelToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("listener answered %s", resp.Status)
		}
	}
	// The first turn runs (the session exists) when the replica dies.
	waitFor(t, "the channel's session", 30*time.Second, func() bool {
		var list struct {
			Sessions []map[string]any `json:"sessions"`
		}
		_ = json.Unmarshal(v.call("session/list", map[string]any{}), &list)
		for _, sess := range list.Sessions {
			if id, _ := sess["session_id"].(string); len(id) > 5 && id[:5] == "chan_" {
				return true
			}
		}
		return false
	})
	victim := replicaPID(t, s, 0)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, 0, victim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the answers of the messages the killed replica held", 90*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(replies[:2], []string{"first after the kill", "second after the kill"}) {
		t.Fatalf("replies %q, want both answers in order", replies)
	}
}
