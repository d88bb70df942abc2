package e2e_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A channel's token rotated with config/set: the old token was accepted
// from the set's answer until the sandbox read the new revision (a few
// milliseconds, at worst its 30 s resync), so a holder of the old token
// posting right after the rotation had its messages queued. A token that
// matches is now checked against the config service before a message is
// taken.
func TestRotatedChannelTokenIsRefusedOnceSet(t *testing.T) {
	t.Parallel()
	v, post := tokenPoster(t, "m", "t")
	if code := post(webChannelToken, 0); code != http.StatusAccepted {
		t.Fatalf("the bound token: %d, want 202", code)
	}
	const rotations = 20
	old, accepted := webChannelToken, 0
	for i := 1; i <= rotations; i++ {
		tok := fmt.Sprintf("rotated-token-%02d-0123456789abcdef0123456789", i)
		v.call("config/set", map[string]any{"prop": "channels.plugin.web.token", "value": tok})
		if code := post(old, i); code == http.StatusAccepted {
			accepted++
		} else if code != http.StatusUnauthorized {
			t.Fatalf("the old token right after rotation %d: %d, want 401", i, code)
		}
		old = tok
	}
	if accepted > 0 {
		t.Fatalf("the old token was accepted right after %d of %d rotations", accepted, rotations)
	}
}

// The other side of a rotation: the new token was refused (401) from the
// set's answer until the sandbox read the new revision, so a client that
// set a token and posted at once was told its token was wrong. A token
// that does not match the held one is now checked against the config
// service before it is refused.
func TestNewChannelTokenIsAcceptedOnceSet(t *testing.T) {
	t.Parallel()
	v, post := tokenPoster(t, "n", "u")
	if code := post(webChannelToken, 0); code != http.StatusAccepted {
		t.Fatalf("the bound token: %d, want 202", code)
	}
	const rotations = 20
	refused := 0
	for i := 1; i <= rotations; i++ {
		tok := fmt.Sprintf("fresh-token-%02d-0123456789abcdef0123456789", i)
		v.call("config/set", map[string]any{"prop": "channels.plugin.web.token", "value": tok})
		switch code := post(tok, i); code {
		case http.StatusAccepted:
		case http.StatusUnauthorized:
			refused++
		default:
			t.Fatalf("the new token right after rotation %d: %d, want 202", i, code)
		}
	}
	if refused > 0 {
		t.Fatalf("the new token was refused right after %d of %d rotations", refused, rotations)
	}
	if code := post("wrong-token-0123456789abcdef0123456789", 99); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d, want 401", code)
	}
}

// tokenPoster starts a stack with the web channel bound (its reply hook
// answering 204) and returns a conversation on it and post, which sends
// message n (id idPrefix+n, on thread threadPrefix+"-"+n) with token and
// returns the listener's status code.
func tokenPoster(t *testing.T, idPrefix, threadPrefix string) (v *conv, post func(token string, n int) int) {
	t.Helper()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v = newConv(t, s, nil)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(hook.Close)
	bindWebChannel(t, v, hook.URL)
	listen := webChannelListen(t, v, "")
	return v, func(token string, n int) int {
		t.Helper()
		body := fmt.Sprintf(`{"id":"%s%d","from":"ann","text":"/say %d","thread":"%s-%d"}`, idPrefix, n, n, threadPrefix, n)
		req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
}
