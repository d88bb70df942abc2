package pluginsandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

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

// Requests with a wrong token share their reads of the token: a Reveal
// per request, each in flight at once, let any client that reached the
// port (every local account) make as many calls on the config service as
// it held connections. At most one read is in flight, whatever the
// number of requests waiting.
func TestChannelTokenReadsAreShared(t *testing.T) {
	var mu sync.Mutex
	inFlight, most, reveals := 0, 0, 0
	release := make(chan struct{})
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(ctx context.Context, _ string) (string, error) {
			mu.Lock()
			inFlight++
			reveals++
			most = max(most, inFlight)
			mu.Unlock()
			select {
			case <-release:
			case <-ctx.Done():
			}
			mu.Lock()
			inFlight--
			mu.Unlock()
			return chanToken, nil
		}
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	const n = 50
	codes := make(chan int, n)
	for range n {
		go func() { codes <- postToken(t, web.Listen, "wrong-token-0123456789abcdef0123456789", `{}`) }()
	}
	// Every request is let through, read after read.
	close(release)
	for range n {
		if code := <-codes; code != http.StatusUnauthorized {
			t.Fatalf("a wrong token: %d, want 401", code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Fatalf("%d requests with a wrong token had %d reads of the token in flight at once, want 1", n, most)
	}
	if reveals > n {
		t.Fatalf("%d requests read the token %d times", n, reveals)
	}
}

// A rotation committed before the replica follows its revision: the
// replica held the old token for the revision it followed, and took
// messages with it, after config/set had answered, until it read the new
// revision (a few milliseconds, at worst the 30 s resync), and refused
// the new one meanwhile. Every token is now checked against the config
// service's.
func TestRotatedTokenHoldsBeforeTheReplicaFollows(t *testing.T) {
	var mu sync.Mutex
	token := chanToken
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			return token, nil
		}
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
	if code := postToken(t, web.Listen, rotated, `{"id":"m3","from":"ann","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("the new token once the rotation is committed: %d, want 202", code)
	}
}

// A wrong token sent again and again, one request after the other: each
// made its own read of the token on the config service (a Reveal), so one
// local account looping on wrong tokens drove config reads as fast as it
// could send. A token other than the one last read now waits for a read
// begun at least WrongTokenGap after the one before (a token just set is
// still read and taken, a moment later at most): the reads such tokens
// make are spaced by the gap, whatever the sender's pace.
func TestWrongTokensInALoopSpaceTheirReads(t *testing.T) {
	var mu sync.Mutex
	var starts []time.Time
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			starts = append(starts, time.Now())
			return chanToken, nil
		}
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	const n = 8
	for i := range n {
		if code := postToken(t, web.Listen, fmt.Sprintf("wrong-token-%02d-0123456789abcdef0123456789", i), `{}`); code != http.StatusUnauthorized {
			t.Fatalf("a wrong token: %d, want 401", code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < pluginsandbox.WrongTokenGap {
			t.Fatalf("%d wrong tokens in a row read the token %d times, reads %d and %d %v apart, less than %v",
				n, len(starts), i-1, i, gap, pluginsandbox.WrongTokenGap)
		}
	}
	t.Logf("%d wrong tokens in a row: %d reads of the token", n, len(starts))
}
