package pluginsandbox_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// postToken posts body to a channel listener with token and returns the
// status code.
func postToken(t *testing.T, addr, token, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A request with a wrong token costs the config service nothing while the
// config revision stays: the listener read the token with a Reveal per
// request, so any client that reached the port (every local account)
// turned each request into a call on the config service. A rotation still
// applies to the first request once the replica follows the revision
// that made it.
func TestChannelTokenIsReadOncePerRevision(t *testing.T) {
	var mu sync.Mutex
	reveals, rev, token := 0, int64(7), chanToken
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			reveals++
			return token, nil
		}
		c.Revision = func() int64 {
			mu.Lock()
			defer mu.Unlock()
			return rev
		}
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	const n = 50
	for range n {
		if code := postToken(t, web.Listen, "wrong-token-0123456789abcdef0123456789", `{}`); code != http.StatusUnauthorized {
			t.Fatalf("a wrong token: %d, want 401", code)
		}
	}
	mu.Lock()
	got := reveals
	mu.Unlock()
	if got > 1 {
		t.Fatalf("%d requests of one revision with a wrong token read the token %d times, want once", n, got)
	}
	// A match is checked again before its message is taken: one read.
	if code := postToken(t, web.Listen, chanToken, `{"id":"m1","from":"ann","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("the token: %d, want 202", code)
	}
	mu.Lock()
	matched := reveals - got
	mu.Unlock()
	if matched != 1 {
		t.Fatalf("the matching request read the token %d times, want once", matched)
	}

	// A rotation: the new revision's token is the one that holds, at the
	// next request.
	const rotated = "rotated-token-0123456789abcdef01234567"
	mu.Lock()
	rev, token = 8, rotated
	mu.Unlock()
	if code := postToken(t, web.Listen, chanToken, `{"id":"m2","from":"ann","text":"hello"}`); code != http.StatusUnauthorized {
		t.Fatalf("the old token after a rotation: %d, want 401", code)
	}
	if code := postToken(t, web.Listen, rotated, `{"id":"m3","from":"ann","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("the new token after a rotation: %d, want 202", code)
	}
}

// A rotation committed before the replica follows its revision: the
// replica held the old token for the revision it followed, and took
// messages with it, after config/set had answered, until it read the new
// revision (a few milliseconds, at worst the 30 s resync). A token that
// matches the held one is now checked against the config service's.
func TestRotatedTokenIsRefusedBeforeTheReplicaFollows(t *testing.T) {
	var mu sync.Mutex
	token := chanToken
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return token, nil
		}
		c.Revision = func() int64 { return 7 } // the replica never follows
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if code := postToken(t, web.Listen, chanToken, `{"id":"m1","from":"ann","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("the token: %d, want 202", code)
	}
	const rotated = "rotated-token-0123456789abcdef01234567"
	mu.Lock()
	token = rotated
	mu.Unlock()
	if code := postToken(t, web.Listen, chanToken, `{"id":"m2","from":"ann","text":"hello"}`); code != http.StatusUnauthorized {
		t.Fatalf("the old token once the rotation is committed: %d, want 401", code)
	}
}
