package e2e_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// One hung reply endpoint held every other call of its channel, in a
// running stack: the plugin ran its polls and sends on one instance, so
// while thread A's reply hung, thread B's message was not even polled
// until A's send was cut (at the 10 s of a plugin's HTTP request, the
// call limit past it). B is now answered while A's reply still hangs.
func TestPluginChannelHungEndpointHoldsNoOtherReply(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)

	var (
		mu     sync.Mutex
		events []string // "A hangs", "A cut", "B answered", in the order the hook saw them
		hungAt time.Time
		gap    time.Duration
	)
	done := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		if body["thread_id"] == "A" {
			events = append(events, "A hangs")
			hungAt = time.Now()
			mu.Unlock()
			select {
			case <-r.Context().Done():
			case <-done:
			}
			mu.Lock()
			events = append(events, "A cut")
			mu.Unlock()
			return
		}
		events = append(events, "B answered")
		gap = time.Since(hungAt)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	t.Cleanup(func() { close(done) })
	bindWebChannel(t, v, hook.URL)
	listen := webChannelListen(t, v, "")
	post := func(thread, text string) {
		t.Helper()
		body, _ := json.Marshal(map[string]string{"id": thread, "from": "ann", "text": text, "thread": thread})
		postWebMessage(t, listen, body)
	}
	seen := func(what string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			if e == what {
				return true
			}
		}
		return false
	}
	post("A", "/say for the hung endpoint")
	waitFor(t, "A's reply to hang", 60*time.Second, func() bool { return seen("A hangs") })
	post("B", "/say for a live endpoint")
	waitFor(t, "B's answer", 60*time.Second, func() bool { return seen("B answered") })
	mu.Lock()
	defer mu.Unlock()
	t.Logf("B answered %v after A's reply began to hang; events %q", gap, events)
	if events[1] != "B answered" {
		t.Fatalf("events %q: B was answered only once A's hung reply was cut", events)
	}
}
