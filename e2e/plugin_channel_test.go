package e2e_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// pluginsList is the plugins/list result.
type pluginsList struct {
	Enabled  bool `json:"enabled"`
	Plugins  []map[string]any
	Channels []struct {
		Alias, Plugin, Listen, State, Reason string
	}
}

func listPlugins(t *testing.T, v *conv) pluginsList {
	t.Helper()
	var l pluginsList
	if err := json.Unmarshal(v.call("plugins/list", map[string]any{}), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// waitFor polls cond every 100 ms until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A channel plugin (the webhook example) bound by config,
// channels.plugin.<alias>, receives a message through the host listener
// in a running stack; the sandbox hands it to a session, and the turn's
// answer goes back out through the plugin to its webhook.
func TestPluginChannelMessageReachesASession(t *testing.T) {
	t.Parallel()
	// The hook listens on loopback, which a plugin reaches only when allowed.
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)

	var (
		mu      sync.Mutex
		replies []map[string]string
		auths   []string
	)
	hookURL := channelhook.Serve(t, func(r channelhook.Reply) {
		mu.Lock()
		replies = append(replies, r.Body)
		auths = append(auths, r.Auth)
		mu.Unlock()
	})

	bindWebChannel(t, v, hookURL)

	// The binding comes up on its own (config change, no restart), on
	// loopback, and configures once its config resolves.
	listen := webChannelListen(t, v, "")
	if !strings.HasPrefix(listen, "127.0.0.1:") {
		t.Fatalf("the listener binds %s, want loopback", listen)
	}

	post := func(body, token string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewBufferString(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	msg := `{"id":"m1","from":"ann","text":"/say hello from the channel","thread":"t-1"}`
	// Any local account reaches a loopback port: without the binding's
	// token, nothing is queued.
	for _, tok := range []string{"", webChannelToken + "x"} {
		if resp := post(msg, tok); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a message with token %q: %s", tok, resp.Status)
		}
	}
	if resp := post(msg, webChannelToken); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("listener answered %s", resp.Status)
	}
	if bad := post(`[1]`, webChannelToken); bad.StatusCode != http.StatusBadRequest {
		t.Fatalf("a non-object body: %v", bad.Status)
	}

	waitFor(t, "the reply on the webhook", 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) > 0
	})
	mu.Lock()
	reply, auth := replies[0], auths[0]
	mu.Unlock()
	if reply["recipient"] != "ann" || reply["content"] != "hello from the channel" || reply["thread_id"] != "t-1" || auth != "Bearer tok-e2e" {
		t.Fatalf("reply %v (auth %q)", reply, auth)
	}

	// The message is in a session of its own, created for the channel.
	var list struct {
		Sessions []map[string]any `json:"sessions"`
	}
	if err := json.Unmarshal(v.call("session/list", map[string]any{}), &list); err != nil {
		t.Fatal(err)
	}
	var sessionID string
	for _, sess := range list.Sessions {
		if id, _ := sess["session_id"].(string); strings.HasPrefix(id, "chan_") {
			sessionID = id
		}
	}
	if sessionID == "" {
		t.Fatalf("no channel session in %v", list.Sessions)
	}
	var msgs struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(v.call("session/messages", map[string]any{"session_id": sessionID}), &msgs); err != nil {
		t.Fatal(err)
	}
	if len(msgs.Messages) < 2 || msgs.Messages[0].Content != "/say hello from the channel" {
		t.Fatalf("channel session transcript %+v", msgs.Messages)
	}
	if l := readLog(t, s, "plugin-sandbox"); strings.Contains(l, "tok-e2e") {
		t.Fatal("the channel's secret token is in the sandbox log")
	}
}

// A channel message whose turn a rebind cuts (here the binding moves to
// another address, same plugin and agent) is delivered again by the new
// binding and answered, in a running stack: its sender, answered 202,
// only got a notice to send it again.
func TestPluginChannelRebindDeliversACutTurnAgain(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)

	hookURL, replies := channelhook.Contents(t)
	bindWebChannel(t, v, hookURL)
	running := func(not string) string { return webChannelListen(t, v, not) }
	listen := running("")
	postWebMessage(t, listen, []byte(`{"id":"m1","from":"ann","text":"/sleep 4000\n/say answered after the rebind","thread":"t-1"}`))
	// The turn runs (its session exists) when the binding moves.
	channelSessionID(t, v)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	moved := lis.Addr().String()
	lis.Close()
	v.call("config/set", map[string]any{"prop": "channels.plugin.web.listen", "value": moved})
	running(listen)
	waitFor(t, "the answer of the cut turn", 60*time.Second, func() bool { return len(replies()) > 0 })
	if got := replies(); got[0] != "answered after the rebind" {
		t.Fatalf("replies %q, want the cut turn's answer", got)
	}
}

// postWebMessage posts body to channel "web" on listen with its token
// and wants it accepted.
func postWebMessage(t *testing.T, listen string, body []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
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

// webChannelToken is the bearer token bindWebChannel gives channel "web".
const webChannelToken = "channel-token-0123456789abcdef0123456789"

// bindWebChannel binds the webhook example plugin as channel "web", its
// replies posted to hookURL.
// webChannelStack starts a stack with the webhook example installed,
// and with echo, its tool ready, the plugins scanned every 200 ms and
// let reach loopback; binds its web channel, replies posted to a hook
// of the test's; and returns the stack, a conversation, the channel's
// address and the replies received so far.
func webChannelStack(t *testing.T, echo bool) (s *e2e.Stack, v *conv, listen string, replies func() []string) {
	t.Helper()
	plugins := []string{"webhook"}
	if echo {
		plugins = append(plugins, "echo")
	}
	s = pluginStack(t, plugins, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v = newConv(t, s, nil)
	if echo {
		waitForPluginTool(t, v, echoTool)
	}
	hookURL, replies := channelhook.Contents(t)
	bindWebChannel(t, v, hookURL)
	return s, v, webChannelListen(t, v, ""), replies
}

func bindWebChannel(t *testing.T, v *conv, hookURL string) {
	t.Helper()
	key := abi.InstanceKey("webhook", abi.WorldChannel, "web")
	v.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "plugins.entries." + key + ".config", "value": map[string]any{"webhook_url": hookURL, "token": "tok-e2e"}},
		{"prop": "channels.plugin.web.plugin", "value": "webhook"},
		{"prop": "channels.plugin.web.token", "value": webChannelToken},
	}})
}

// webChannelListen waits until channel "web" runs, configured, on an
// address other than not, and returns that address.
func webChannelListen(t *testing.T, v *conv, not string) string {
	t.Helper()
	var listen string
	waitFor(t, "the channel binding", 60*time.Second, func() bool {
		for _, ch := range listPlugins(t, v).Channels {
			if ch.Alias == "web" && ch.State == "running" && ch.Reason == "" && ch.Listen != not {
				listen = ch.Listen
				return true
			}
		}
		return false
	})
	return listen
}

// bindWebChannelOnBothReplicas binds the channel web, replying to
// hookURL, on a fixed address, which both replicas of s bind
// (SO_REUSEPORT: with port 0 each would listen on a port of its own),
// and waits until both have bound it; it returns the address.
func bindWebChannelOnBothReplicas(t *testing.T, s *e2e.Stack, v *conv, hookURL string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := lis.Addr().String()
	lis.Close()
	v.call("config/set", map[string]any{"prop": "channels.plugin.web.listen", "value": listen})
	bindWebChannel(t, v, hookURL)
	// Both replicas bound: each lists its own binding, and plugins/list
	// asks one of them; the kernel spreads fresh connections over both.
	webChannelListen(t, v, "")
	logs := replicaLogs(s, 2)
	waitFor(t, "both replicas bound", 60*time.Second, func() bool {
		for _, l := range logs {
			if !strings.Contains(readFile(l), `"channel bound"`) {
				return false
			}
		}
		return true
	})
	return listen
}
