package pluginsandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testwait"
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

// A sender of a wrong token that leaves while its request waits for the
// gap between reads: the wait was a time.Sleep, so its handler, and one
// of the listener's bounded connections, stayed taken for the rest of
// the gap (100 ms each; lengthened here to an hour, past the test's
// bound, so that the hold shows). It now waits on the request's
// context: with the listener held to one connection, a sender with the
// right token is served once the one that left is gone.
func TestWrongTokenSenderThatLeavesFreesItsHandler(t *testing.T) {
	waiting := make(chan struct{}, 1)
	defer pluginsandbox.SetWrongTokenGap(time.Hour, func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})()
	defer pluginsandbox.SetChannelConnections(1)()
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) { return chanToken, nil }
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	// send posts until the one connection the listener serves is free
	// (a connection past it is answered 503 at once): the answer's
	// status, or the request's error.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	send := func(ctx context.Context, token, body string) (int, error) {
		deadline := time.Now().Add(testwait.Bound)
		for {
			var rd io.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+web.Listen+"/", rd)
			if err != nil {
				return 0, err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			code := 0
			if err == nil {
				resp.Body.Close()
				code = resp.StatusCode
			}
			switch {
			case ctx.Err() != nil:
				return 0, err
			case time.Now().After(deadline):
				return code, err
			case err == nil && code != http.StatusServiceUnavailable:
				return code, nil
			}
			// Refused at the bound (503, or the refusal's early close).
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The first wrong token reads the token; the next one must wait for
	// a read an hour after it.
	if code, err := send(t.Context(), "wrong-token-00-0123456789abcdef0123456789", "{}"); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d %v, want 401", code, err)
	}
	ctx, leave := context.WithCancel(t.Context())
	left := make(chan error, 1)
	go func() {
		// No body: the server sees a sender leave only once the body is
		// read (or there is none), as a sender looping on tokens sends.
		code, err := send(ctx, "wrong-token-01-0123456789abcdef0123456789", "")
		if err == nil {
			err = fmt.Errorf("answered %d", code)
		}
		left <- err
	}()
	testwait.Recv(t, waiting)
	leave()
	if err := testwait.Recv(t, left); !errors.Is(err, context.Canceled) {
		t.Fatalf("the request that left: %v, want cancelled", err)
	}
	code, err := send(t.Context(), chanToken, `{"id":"m1","from":"ann","text":"hello"}`)
	if code != http.StatusAccepted {
		t.Fatalf("the right token once the wrong one's sender left: %d %v, want 202 (the listener's one connection still taken)", code, err)
	}
}

// A wrong token's sender that leaves mid-body: the server saw a sender
// leave only once its body was read, and a token waiting for the gap
// between reads reads no body, so a sender that announced a body, sent
// part of it and left kept its handler, and one of the listener's
// bounded connections, until the wait ended (an hour here). The body
// is now read while the token waits, and its sender's leaving ends the
// wait: in order, the wait begins, the sender leaves, and the right
// token is taken on the one connection the listener serves.
func TestWrongTokenSenderThatLeavesMidBodyFreesItsHandler(t *testing.T) {
	waiting := make(chan struct{}, 1)
	defer pluginsandbox.SetWrongTokenGap(time.Hour, func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})()
	defer pluginsandbox.SetChannelConnections(1)()
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) { return chanToken, nil }
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if code := postToken(t, web.Listen, "wrong-token-00-0123456789abcdef0123456789", "{}"); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d, want 401", code)
	}
	// The first request's 401 reaches the client before the server has
	// closed its connection and given its one slot back: a connection
	// made in between is refused at the bound (503 and closed), and its
	// request never reaches the token's wait. It is made again until
	// one does.
	var conn net.Conn
	deadline := time.Now().Add(testwait.Bound)
	for conn == nil {
		c, err := net.Dial("tcp", web.Listen)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":",
			"wrong-token-01-0123456789abcdef0123456789"); err != nil {
			t.Fatal(err)
		}
		refused := make(chan string, 1)
		go func() {
			// A request that waits reads nothing; a refused one reads
			// the 503 and its connection's end.
			b, _ := io.ReadAll(c)
			refused <- string(b)
		}()
		select {
		case <-waiting:
			conn = c
		case got := <-refused:
			c.Close()
			if !strings.Contains(got, " 503 ") || time.Now().After(deadline) {
				t.Fatalf("the wrong token sent mid-body was answered %q, want it to wait for the next read", got)
			}
			t.Logf("refused at the bound, made again: %q", got)
			time.Sleep(20 * time.Millisecond)
		case <-time.After(testwait.Bound):
			t.Fatal("the wrong token sent mid-body neither waited nor was refused")
		}
	}
	conn.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	deadline = time.Now().Add(testwait.Bound)
	for {
		// Refused at the bound (503, or the refusal's early close) while
		// the one connection is taken.
		req, err := http.NewRequest(http.MethodPost, "http://"+web.Listen+"/", strings.NewReader(`{"id":"m1","from":"ann","text":"hello"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+chanToken)
		resp, err := client.Do(req)
		code := 0
		if err == nil {
			resp.Body.Close()
			code = resp.StatusCode
		}
		if code == http.StatusAccepted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the right token once the wrong one's sender left mid-body: %d %v, want 202 (the listener's one connection still taken)", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
