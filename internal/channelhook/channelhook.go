// Package channelhook serves, to tests, the upstream service a channel
// plugin built from the webhook example posts to: every reply the plugin
// posts is handed to the test, and the held guest's two paths (/hold
// keeps a message, /held gives it back) stand for a mail server that
// keeps a message unread whatever the plugin is told.
//
// The e2e tests and services/pluginsandbox's drive the same guests
// against the same upstream, one through a stack and one through a
// sandbox in the test process; this is that upstream, once.
//
// It is for tests only; no binary imports it.
package channelhook

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
)

// Reply is one post of the plugin's to the upstream: its JSON body
// (content, thread_id, ...) and its Authorization header.
type Reply struct {
	Body map[string]string
	Auth string
}

// Serve starts the upstream and returns its URL; it stops when the test
// ends. onReply is called with every reply, on the request's goroutine
// and before the answer (204), so a handler that blocks holds the
// plugin's post as a slow service would. /hold and /held are the held
// guest's (HeldWebhookSource): /hold keeps the body posted, /held gives
// it back at every ask, 204 while nothing is kept; no other guest posts
// there.
func Serve(t testing.TB, onReply func(Reply)) string {
	t.Helper()
	return serve(t, onReply, new(atomic.Bool))
}

// ServeAway is Serve with a switch: while away is set, an ask of /held
// has its connection closed unanswered, as a service gone would (the
// plugin's poll fails).
func ServeAway(t testing.TB, onReply func(Reply)) (url string, away *atomic.Bool) {
	t.Helper()
	away = new(atomic.Bool)
	return serve(t, onReply, away), away
}

func serve(t testing.TB, onReply func(Reply), away *atomic.Bool) string {
	var (
		mu   sync.Mutex
		kept []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/hold":
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			kept = b
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		case "/held":
			if away.Load() {
				panic(http.ErrAbortHandler)
			}
			mu.Lock()
			b := kept
			mu.Unlock()
			if b == nil {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			_, _ = w.Write(b)
		default:
			var body map[string]string
			_ = json.NewDecoder(r.Body).Decode(&body)
			onReply(Reply{Body: body, Auth: r.Header.Get("Authorization")})
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Chan is Serve with every reply's body sent on a channel of n places,
// for a test that waits for replies one by one (testwait.Recv). A reply
// past n unread ones waits in its handler until the test reads.
func Chan(t testing.TB, n int) (url string, replies chan map[string]string) {
	t.Helper()
	replies = make(chan map[string]string, n)
	return Serve(t, func(r Reply) { replies <- r.Body }), replies
}

// Contents is Serve keeping each reply's content in the order they
// came, for a test that polls; contents returns what came so far.
func Contents(t testing.TB) (url string, contents func() []string) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []string
	)
	url = Serve(t, func(r Reply) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.Body["content"])
	})
	return url, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// HeldWebhookSource is the held guest's source: the webhook example's
// poll made to answer first what its upstream keeps (/held), a message
// whose id starts with "held" being kept there (/hold) once polled. It
// is built with guestbuild.WasmWith("webhook", "testhooks.go", src).
func HeldWebhookSource() (string, error) {
	b, err := os.ReadFile(filepath.Join(guestbuild.Root(), "internal", "guestbuild", "testdata", "webhook_held.go.txt"))
	if err != nil {
		return "", err
	}
	return string(b), nil
}
