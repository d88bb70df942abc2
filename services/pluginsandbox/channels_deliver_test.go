package pluginsandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// chanToken is the listener token of the channels these tests bind.
const chanToken = "channel-token-0123456789abcdef0123456789"

// seenPrompt is one Prompt the fake session service received.
type seenPrompt struct {
	session, agent, prompt string
	// deadline is whether the call's context had one.
	deadline bool
	// key is the prompt's idempotency key, and maxOpen the
	// max_open_of_surface its session was last opened with.
	key     string
	maxOpen int32
}

// fakeSessions is a session service that keeps, like the real one, the
// agent a session was created for: NewSession with a known id resumes it
// as it is, whatever agent the request names.
type fakeSessions struct {
	sessionv1.SessionServiceClient

	mu      sync.Mutex
	agents  map[string]string
	newErrs []error // answered by NewSession, one per call, before it serves
	// promptErrs are answered by Prompt, one per call, before it serves.
	promptErrs []error
	// outcome is every turn's outcome (unspecified when zero).
	outcome sessionv1.TurnOutcome
	// hold, when set, is what the next Prompt waits for (or its context).
	hold chan struct{}
	// holdFor are what a Prompt of the given text waits for.
	holdFor map[string]chan struct{}
	// answer has every turn answer "re: <prompt>".
	answer  bool
	prompts chan seenPrompt
	// inflight counts the Prompts running, by session and together;
	// overlap and most are what they reached.
	inflight map[string]int
	running  int
	overlap  bool
	most     int
	// maxOpen is the max_open_of_surface of each session's last NewSession.
	maxOpen map[string]int32
}

func newFakeSessions() *fakeSessions {
	return &fakeSessions{agents: map[string]string{}, prompts: make(chan seenPrompt, 64),
		holdFor: map[string]chan struct{}{}, inflight: map[string]int{}, maxOpen: map[string]int32{}}
}

func (f *fakeSessions) NewSession(_ context.Context, req *sessionv1.NewSessionRequest, _ ...grpc.CallOption) (*sessionv1.NewSessionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.newErrs) > 0 {
		err := f.newErrs[0]
		f.newErrs = f.newErrs[1:]
		return nil, err
	}
	id := req.GetSessionId()
	f.maxOpen[id] = req.GetMaxOpenOfSurface()
	if agent, ok := f.agents[id]; ok {
		return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: agent}, nil
	}
	f.agents[id] = req.GetAgentAlias()
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: req.GetAgentAlias(), Created: true}, nil
}

// List lists no session: none was open before the test.
func (f *fakeSessions) List(context.Context, *sessionv1.ListRequest, ...grpc.CallOption) (*sessionv1.ListResponse, error) {
	return &sessionv1.ListResponse{}, nil
}

// State reports every session idle.
func (f *fakeSessions) State(_ context.Context, req *sessionv1.StateRequest, _ ...grpc.CallOption) (*sessionv1.StateResponse, error) {
	return &sessionv1.StateResponse{SessionId: req.GetSessionId(), State: sessionv1.SessionState_SESSION_STATE_IDLE}, nil
}

// Close closes a session; its next NewSession resumes it.
func (f *fakeSessions) Close(_ context.Context, req *sessionv1.CloseRequest, _ ...grpc.CallOption) (*sessionv1.CloseResponse, error) {
	return &sessionv1.CloseResponse{SessionId: req.GetSessionId(), Closed: true}, nil
}

func (f *fakeSessions) Prompt(ctx context.Context, req *sessionv1.PromptRequest, _ ...grpc.CallOption) (*sessionv1.PromptResponse, error) {
	f.mu.Lock()
	if len(f.promptErrs) > 0 {
		err := f.promptErrs[0]
		f.promptErrs = f.promptErrs[1:]
		f.mu.Unlock()
		return nil, err
	}
	agent := f.agents[req.GetSessionId()]
	maxOpen := f.maxOpen[req.GetSessionId()]
	outcome := f.outcome
	hold := f.hold
	f.hold = nil
	if h, ok := f.holdFor[req.GetPrompt()]; ok {
		hold = h
	}
	answer := ""
	if f.answer {
		answer = "re: " + req.GetPrompt()
	}
	f.inflight[req.GetSessionId()]++
	f.overlap = f.overlap || f.inflight[req.GetSessionId()] > 1
	f.running++
	f.most = max(f.most, f.running)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight[req.GetSessionId()]--
		f.running--
		f.mu.Unlock()
	}()
	_, deadline := ctx.Deadline()
	f.prompts <- seenPrompt{session: req.GetSessionId(), agent: agent, prompt: req.GetPrompt(), deadline: deadline,
		key: req.GetIdempotencyKey(), maxOpen: maxOpen}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// No content (unless answer): nothing is sent back through the plugin.
	return &sessionv1.PromptResponse{SessionId: req.GetSessionId(), Outcome: outcome, Content: answer}, nil
}

// channelServer is a sandbox with the webhook example installed and
// configured for the alias web, handing its messages to sessions.
func channelServer(t *testing.T, sessions sessionv1.SessionServiceClient) *testServer {
	t.Helper()
	return channelServerHook(t, sessions, "http://127.0.0.1:1/")
}

// channelServerHook is channelServer with the webhook's replies posted to
// hook.
func channelServerHook(t *testing.T, sessions sessionv1.SessionServiceClient, hook string, mut ...func(*pluginsandbox.Config)) *testServer {
	t.Helper()
	return channelServerHost(t, sessions, hook, nil, mut...)
}

// channelServerHost is channelServerHook on a host whose config edit
// changed (nil: none).
func channelServerHost(t *testing.T, sessions sessionv1.SessionServiceClient, hook string, edit func(*wasmhost.Config), mut ...func(*pluginsandbox.Config)) *testServer {
	t.Helper()
	dir := t.TempDir()
	installExample(t, dir, "webhook")
	return webhookSandbox(t, dir, sessions, hook, edit, mut...)
}

// webhookSandbox is a sandbox of the plugins installed in dir, the
// webhook among them, with the webhook configured for the alias web to
// post its replies to hook and hand its messages to sessions, on a host
// of its own whose config edit changed (nil: none).
func webhookSandbox(t *testing.T, dir string, sessions sessionv1.SessionServiceClient, hook string, edit func(*wasmhost.Config), mut ...func(*pluginsandbox.Config)) *testServer {
	t.Helper()
	cfg := &wasmhost.MemoryConfig{}
	cfg.Set(wasmhost.InstanceKey("webhook", wasmhost.WorldChannel, "web"), map[string]string{"webhook_url": hook, "token": "tok"})
	// The hook is on loopback, which a plugin reaches only when allowed.
	hc := wasmhost.Config{CacheDir: cacheDir, CacheMaxBytes: guestbuild.CompileCacheMaxBytes, Logger: zap.NewNop(),
		HTTP: wasmhost.HTTPLimits{AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}
	if edit != nil {
		edit(&hc)
	}
	ctx := context.Background()
	host, err := wasmhost.New(ctx, hc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Close(ctx) })
	return newTestServer(t, dir, func(c *pluginsandbox.Config) {
		c.Host = host
		c.ConfigSource = cfg
		c.Sessions = sessions
		c.Reveal = func(context.Context, string) (string, error) { return chanToken, nil }
		for _, m := range mut {
			m(c)
		}
	})
}

// bindChannels makes the bindings the live settings and rescans; it
// returns this replica's channels by alias.
func bindChannels(t *testing.T, ts *testServer, bindings ...pluginsandbox.ChannelBinding) map[string]*pluginv1.Channel {
	t.Helper()
	ts.live.set(func(l *pluginsandbox.Live) {
		l.Channels = map[string]pluginsandbox.ChannelBinding{}
		for _, b := range bindings {
			l.Channels[b.Alias] = b
		}
	})
	ts.rescan(t)
	listed, err := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*pluginv1.Channel{}
	for _, c := range listed.Channels {
		out[c.Alias] = c
	}
	return out
}

// postMessage posts body to a channel listener with the token and returns
// the status code.
func postMessage(t *testing.T, addr, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+chanToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A channel rebound to another agent answers with that agent, also in a
// conversation it had before: the session service resumes a session with
// the agent it was created for, and the session id named the alias, the
// plugin and the conversation only, so a sender who kept writing on a
// known thread kept the old agent (and its tools) after the operator
// chose another.
func TestChannelRebindToAnotherAgentAppliesToKnownThreads(t *testing.T) {
	fs := newFakeSessions()
	ts := channelServer(t, fs)
	msg := `{"id":"m1","from":"ann","text":"hello","thread":"t-1"}`

	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if code := postMessage(t, web.Listen, msg); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	if p := testwait.Recv(t, fs.prompts); p.agent != "open" {
		t.Fatalf("first prompt went to agent %q, want open", p.agent)
	}

	web = bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "locked"})["web"]
	if code := postMessage(t, web.Listen, msg); code != http.StatusAccepted {
		t.Fatalf("post after the rebind: %d", code)
	}
	if p := testwait.Recv(t, fs.prompts); p.agent != "locked" {
		t.Fatalf("after binding web to agent locked, the known thread's prompt went to agent %q (session %s)", p.agent, p.session)
	}
}

// Two aliases given one listen address are both refused, each naming the
// other: with SO_REUSEPORT both bound it, and the kernel spread the
// connections over them, so a sender's messages reached either agent at
// random (or were refused with the other alias's token).
func TestChannelsSharingAListenAddressAreRefused(t *testing.T) {
	ts := channelServer(t, newFakeSessions())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	got := bindChannels(t, ts,
		pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: addr, Agent: "open"},
		pluginsandbox.ChannelBinding{Alias: "web2", Plugin: "webhook", Listen: addr, Agent: "locked"})
	for alias, other := range map[string]string{"web": "web2", "web2": "web"} {
		c := got[alias]
		if c == nil || c.State != "failed" || !strings.Contains(c.Reason, addr) || !strings.Contains(c.Reason, other) {
			t.Fatalf("channel %s on the address of %s: %v", alias, other, c)
		}
	}
	// Once apart, both bind.
	got = bindChannels(t, ts,
		pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: addr, Agent: "open"},
		pluginsandbox.ChannelBinding{Alias: "web2", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "locked"})
	for _, alias := range []string{"web", "web2"} {
		if c := got[alias]; c == nil || c.State != "running" {
			t.Fatalf("channel %s apart: %v", alias, c)
		}
	}
}

// Messages the listener accepted (202) are still delivered when the
// binding is rebuilt (its agent changed): each binding made a new inbound
// queue, and what the old one held was dropped with it, never answered.
func TestChannelRebindKeepsQueuedMessages(t *testing.T) {
	fs := newFakeSessions()
	fs.hold = make(chan struct{}) // the first turn runs until the rebind
	ts := channelServer(t, fs)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	post := func(addr, text string) {
		t.Helper()
		if code := postMessage(t, addr, `{"id":"`+text+`","from":"ann","text":"`+text+`"}`); code != http.StatusAccepted {
			t.Fatalf("post %s: %d", text, code)
		}
	}
	post(web.Listen, "m1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "m1" {
		t.Fatalf("first prompt %q", p.prompt)
	}
	post(web.Listen, "m2")
	post(web.Listen, "m3")
	// m2 and m3 are polled, waiting behind m1: the next binding takes
	// them over as well as what its queue still holds.
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		if n := pluginsandbox.ChannelPending(ts.Server, "web"); n != 3 {
			return fmt.Errorf("%d messages polled and undelivered, want m1..m3", n)
		}
		return nil
	})

	web = bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "locked"})["web"]
	post(web.Listen, "m4")
	var got []string
	for len(got) == 0 || got[len(got)-1] != "m4" {
		got = append(got, testwait.Recv(t, fs.prompts).prompt)
	}
	// m1, whose turn the rebind cut, is delivered again first.
	if strings.Join(got, " ") != "m1 m2 m3 m4" {
		t.Fatalf("prompts after the rebind: %v, want m1 m2 m3 m4", got)
	}
}

// A message that arrives while the session service (or the config service
// behind it) is away, or while another replica runs a turn of the same
// conversation, waits and is delivered, in order: it was logged and
// dropped, though the sender had been told 202.
func TestChannelMessageWaitsForTheSessionService(t *testing.T) {
	fs := newFakeSessions()
	away := status.Error(codes.Unavailable, "connection refused")
	fs.newErrs = []error{away, away, away}
	fs.promptErrs = []error{rpcerr.Error(codes.FailedPrecondition, rpcerr.ReasonSessionBusy, rpcerr.NoIndex, "Session s is running a turn")}
	ts := channelServer(t, fs)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	for _, text := range []string{"m1", "m2"} {
		if code := postMessage(t, web.Listen, `{"id":"`+text+`","from":"ann","text":"`+text+`"}`); code != http.StatusAccepted {
			t.Fatalf("post %s: %d", text, code)
		}
	}
	for _, want := range []string{"m1", "m2"} {
		if p := testwait.Recv(t, fs.prompts); p.prompt != want {
			t.Fatalf("prompt %q, want %q: a message sent while the session service was away was dropped", p.prompt, want)
		}
	}
}

// dialWritten dials addr over TCP and writes request, if any, raw; the
// connection closes at the test's end, if the test has not closed it.
func dialWritten(t *testing.T, addr, request string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if request != "" {
		if _, err := conn.Write([]byte(request)); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// A removed binding accepts nothing more once its removal returned: a
// request still sending its body when the listener's graceful stop gave
// up (5 s) kept its connection, and was answered 202 afterwards, queued
// into a channel nobody drains.
func TestChannelRemovedAcceptsNothingAfterwards(t *testing.T) {
	ts := channelServer(t, newFakeSessions())
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	body := `{"id":"late","from":"ann","text":"late"}`
	conn := dialWritten(t, web.Listen, fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", chanToken, len(body), body[:5]))
	// A whole request on a second connection, answered, is the barrier:
	// the server accepts in the order connections came, so the first one
	// is in its handler by then.
	if code := postMessage(t, web.Listen, `[1]`); code != http.StatusBadRequest {
		t.Fatalf("barrier: %d", code)
	}

	bindChannels(t, ts) // removes web; its stop gives up on the slow request
	_, _ = conn.Write([]byte(body[5:]))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a removed channel answered %s to a message completed after its removal", resp.Status)
	}
}

// A listener serves a bounded number of connections at once; one past
// the bound is answered 503 and closed. Anyone who reaches the address
// could open connections without limit (each a goroutine and buffers,
// kept by a request every idle minute, no token needed), up to the
// sandbox's descriptors, which its gRPC server and plugins share.
func TestChannelListenerBoundsItsConnections(t *testing.T) {
	defer pluginsandbox.SetChannelConnections(3)()
	ts := channelServer(t, newFakeSessions())
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	var held []net.Conn
	for range 3 {
		held = append(held, dialWritten(t, web.Listen, "POST / HTTP/1.1\r\nHost: x\r\n"))
	}
	extra := dialWritten(t, web.Listen, "")
	// Nothing is written: the refusal comes unasked (and a request
	// unread when the server closes could turn its FIN into a reset).
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	if err != nil {
		t.Fatalf("a connection past the bound: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a connection past the bound was answered %s, want 503", resp.Status)
	}
	// A slot freed serves again.
	held[0].Close()
	// Until the server has seen the close, a post may still meet the
	// unasked 503 and a closed connection: asked again, not failed.
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		req, _ := http.NewRequest(http.MethodPost, "http://"+web.Listen+"/", bytes.NewBufferString(`[1]`))
		req.Header.Set("Authorization", "Bearer "+chanToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			return fmt.Errorf("after a slot freed: %d", resp.StatusCode)
		}
		return nil
	})
}

// A message that gets no answer (the session service refused it, or its
// turn failed or was cancelled without a word) is answered with a notice
// through the plugin: the sender, told 202, heard nothing at all.
func TestChannelUnansweredMessageGetsANotice(t *testing.T) {
	hookURL, replies := channelhook.Chan(t, 8)
	fs := newFakeSessions()
	fs.promptErrs = []error{rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, "`prompt` is required")}
	ts := channelServerHook(t, fs, hookURL)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	if code := postMessage(t, web.Listen, `{"id":"m1","from":"ann","text":"","thread":"t-1"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	r := testwait.Recv(t, replies)
	if r["recipient"] != "ann" || r["thread_id"] != "t-1" || !strings.Contains(r["content"], "could not be answered") {
		t.Fatalf("reply to a refused message: %v", r)
	}

	fs.mu.Lock()
	fs.outcome = sessionv1.TurnOutcome_TURN_OUTCOME_FAILED
	fs.mu.Unlock()
	if code := postMessage(t, web.Listen, `{"id":"m2","from":"bob","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	testwait.Recv(t, fs.prompts)
	r = testwait.Recv(t, replies)
	if r["recipient"] != "bob" || !strings.Contains(r["content"], "failed") {
		t.Fatalf("reply to a failed turn: %v", r)
	}
}

// A channel's turn runs under the agent's own bounds, not one of the
// channel's: the Prompt call carried a fixed five-minute deadline, which
// cancelled a turn waiting on an approval the operator had given longer
// (agents.*.approval_timeout_secs goes to a day, step_timeout_secs
// defaults to half an hour) and answered in time, e.g. from the phone.
func TestChannelTurnHasNoDeadlineOfItsOwn(t *testing.T) {
	fs := newFakeSessions()
	ts := channelServer(t, fs)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if code := postMessage(t, web.Listen, `{"id":"m1","from":"ann","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	if p := testwait.Recv(t, fs.prompts); p.deadline {
		t.Fatal("the channel's Prompt call has a deadline of its own, cutting the agent's approval and step timeouts short")
	}
}

// A message whose token cannot be checked (the config service is away)
// is answered 503, to retry, not 401: the sender was told its token was
// wrong, with the hint to send the one it had sent.
func TestChannelTokenUncheckableIsNotUnauthorized(t *testing.T) {
	var mu sync.Mutex
	away := true
	ts := channelServerHook(t, newFakeSessions(), "http://127.0.0.1:1/", func(c *pluginsandbox.Config) {
		c.Reveal = func(context.Context, string) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			if away {
				return "", status.Error(codes.Unavailable, "connection refused")
			}
			return chanToken, nil
		}
	})
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if code := postMessage(t, web.Listen, `{"id":"m1","from":"ann","text":"hello"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("a message while its token cannot be checked: %d, want 503", code)
	}
	mu.Lock()
	away = false
	mu.Unlock()
	if code := postMessage(t, web.Listen, `{"id":"m1","from":"ann","text":"hello"}`); code != http.StatusAccepted {
		t.Fatalf("a message once the token is checked again: %d", code)
	}
}

// A refused request (no token, a wrong one) ends its connection: kept
// alive, an unauthenticated client held one of the listener's bounded
// connections for a minute per request, and took them all with a few
// hundred.
func TestChannelRefusedRequestClosesItsConnection(t *testing.T) {
	ts := channelServer(t, newFakeSessions())
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	conn := dialWritten(t, web.Listen, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("a wrong token: %s, close %v; want 401 and the connection closed", resp.Status, resp.Close)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the connection of a refused request stays open")
	}
}

// replyHook is the upstream a channel's replies are posted to, each
// sent on replies; it is the held guest's (heldWebhook) as well.
func replyHook(t *testing.T) (url string, replies chan map[string]string) {
	t.Helper()
	return channelhook.Chan(t, 64)
}

// replyHookAway is replyHook with channelhook.ServeAway's switch: while
// away is set, the held guest's poll of /held fails.
func replyHookAway(t *testing.T) (url string, replies chan map[string]string, away *atomic.Bool) {
	t.Helper()
	replies = make(chan map[string]string, 64)
	url, away = channelhook.ServeAway(t, func(r channelhook.Reply) { replies <- r.Body })
	return url, replies, away
}

// m1RunsUntilTheUnbind binds web to a sandbox whose replies reach the
// returned channel, and posts m1 on ann's thread A, whose turn runs until
// its binding stops; it returns once the turn started.
func m1RunsUntilTheUnbind(t *testing.T) (ts *testServer, fs *fakeSessions, web *pluginv1.Channel, replies chan map[string]string) {
	t.Helper()
	hook, replies := replyHook(t)
	fs = newFakeSessions()
	fs.holdFor["m1"] = make(chan struct{})
	ts = channelServerHook(t, fs, hook)
	web = bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postThread(t, web.Listen, "A", "m1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "m1" {
		t.Fatalf("first prompt %q", p.prompt)
	}
	return ts, fs, web, replies
}

// postThread posts the message text on thread from ann.
func postThread(t *testing.T, addr, thread, text string) {
	t.Helper()
	if code := postMessage(t, addr, `{"id":"`+text+`","from":"ann","text":"`+text+`","thread":"`+thread+`"}`); code != http.StatusAccepted {
		t.Fatalf("post %s: %d", text, code)
	}
}

// A turn that waits (on an approval, for as long as the agent allows)
// holds its own conversation only: the channel delivered one message at
// a time, so every other conversation waited behind it, and once the
// queue filled every sender was answered 503.
func TestChannelConversationsDoNotWaitForEachOther(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	fs.answer = true
	release := make(chan struct{})
	fs.holdFor["a1"] = release
	ts := channelServerHook(t, fs, hook)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]

	postThread(t, web.Listen, "A", "a1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "a1" {
		t.Fatalf("first prompt %q", p.prompt)
	}
	postThread(t, web.Listen, "B", "b1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "b1" {
		t.Fatalf("prompt %q, want b1 while a1's turn waits", p.prompt)
	}
	if r := testwait.Recv(t, replies); r["content"] != "re: b1" || r["thread_id"] != "B" {
		t.Fatalf("reply while a1's turn waits: %v, want b1's answer", r)
	}
	close(release)
	if r := testwait.Recv(t, replies); r["content"] != "re: a1" || r["thread_id"] != "A" {
		t.Fatalf("reply once a1's turn ended: %v", r)
	}
}

// The messages of one conversation are delivered in order, one at a time,
// also while other conversations run: its session runs one turn at a
// time, and a second Prompt is refused as busy.
func TestChannelConversationKeepsItsOrder(t *testing.T) {
	fs := newFakeSessions()
	release := make(chan struct{})
	fs.holdFor["a1"] = release
	ts := channelServer(t, fs)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postThread(t, web.Listen, "A", "a1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "a1" {
		t.Fatalf("first prompt %q", p.prompt)
	}
	for _, text := range []string{"a2", "a3", "a4"} {
		postThread(t, web.Listen, "A", text)
	}
	postThread(t, web.Listen, "B", "b1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "b1" {
		t.Fatalf("prompt %q, want b1 (a2 must wait for a1)", p.prompt)
	}
	// a2..a4 are polled, waiting behind a1.
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		if n := pluginsandbox.ChannelPending(ts.Server, "web"); n != 4 {
			return fmt.Errorf("%d messages polled and undelivered, want a1..a4", n)
		}
		return nil
	})
	close(release)
	for _, want := range []string{"a2", "a3", "a4"} {
		if p := testwait.Recv(t, fs.prompts); p.prompt != want {
			t.Fatalf("prompt %q, want %q", p.prompt, want)
		}
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.overlap {
		t.Fatal("two turns of one conversation ran at once")
	}
}

// A channel runs a bounded number of conversations at once; the next
// waits for one to end (and then runs).
func TestChannelBoundsItsConversations(t *testing.T) {
	defer pluginsandbox.SetChannelConversations(2)()
	fs := newFakeSessions()
	c1, c2 := make(chan struct{}), make(chan struct{})
	fs.holdFor["c1"], fs.holdFor["c2"] = c1, c2
	ts := channelServer(t, fs)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postThread(t, web.Listen, "1", "c1")
	postThread(t, web.Listen, "2", "c2")
	got := map[string]bool{}
	for range 2 {
		got[testwait.Recv(t, fs.prompts).prompt] = true
	}
	if !got["c1"] || !got["c2"] {
		t.Fatalf("prompts %v, want c1 and c2", got)
	}
	postThread(t, web.Listen, "3", "c3")
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		if n := pluginsandbox.ChannelPending(ts.Server, "web"); n != 3 {
			return fmt.Errorf("%d messages polled and undelivered, want c1..c3", n)
		}
		return nil
	})
	fs.mu.Lock()
	most := fs.most
	fs.mu.Unlock()
	if most != 2 {
		t.Fatalf("%d turns ran at once, want the bound 2", most)
	}
	close(c1)
	if p := testwait.Recv(t, fs.prompts); p.prompt != "c3" {
		t.Fatalf("prompt %q, want c3 once c1 ended", p.prompt)
	}
	close(c2)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.most != 2 {
		t.Fatalf("%d turns ran at once, want the bound 2", fs.most)
	}
}

// One conversation holds a bounded number of polled messages; one more
// is refused with a notice, and the conversation goes on with the rest.
// Unbounded, one sender whose turn waits took the backlog that every
// conversation of the channel shares.
func TestChannelConversationBacklogIsBounded(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	release := make(chan struct{})
	fs.holdFor["a0"] = release
	ts := channelServerHook(t, fs, hook)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postThread(t, web.Listen, "A", "a0")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "a0" {
		t.Fatalf("first prompt %q", p.prompt)
	}
	const bound = 32 // the one in delivery and 31 waiting
	for i := 1; i <= bound; i++ {
		postThread(t, web.Listen, "A", fmt.Sprintf("a%d", i))
	}
	r := testwait.Recv(t, replies)
	if r["recipient"] != "ann" || r["thread_id"] != "A" || !strings.Contains(r["content"], "not delivered") {
		t.Fatalf("reply to a message past the conversation's backlog: %v", r)
	}
	close(release)
	for i := 1; i < bound; i++ {
		if p := testwait.Recv(t, fs.prompts); p.prompt != fmt.Sprintf("a%d", i) {
			t.Fatalf("prompt %q, want a%d", p.prompt, i)
		}
	}
	postThread(t, web.Listen, "A", "last")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "last" {
		t.Fatalf("prompt %q, want last (a%d was refused)", p.prompt, bound)
	}
}

// A thread and a sender of the same name are two conversations, with a
// session each: the conversation was keyed by the thread, else the
// sender, so a message on thread "bob" went to the session of sender
// "bob" writing without a thread, with its history (and the agent's
// answer drew on it).
func TestChannelThreadAndSenderOfOneNameAreApart(t *testing.T) {
	fs := newFakeSessions()
	ts := channelServer(t, fs)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	if code := postMessage(t, web.Listen, `{"id":"m1","from":"bob","text":"from bob"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	direct := testwait.Recv(t, fs.prompts)
	if code := postMessage(t, web.Listen, `{"id":"m2","from":"mallory","text":"on thread bob","thread":"bob"}`); code != http.StatusAccepted {
		t.Fatalf("post: %d", code)
	}
	threaded := testwait.Recv(t, fs.prompts)
	if direct.session == threaded.session {
		t.Fatalf("sender bob (no thread) and thread bob share session %s", direct.session)
	}
}

// A sender flooding its conversation past the backlog bound, whose
// notices hang in the plugin's send, holds up no other conversation for
// more than the one notice in flight: the poller sent every refusal's
// notice itself, each up to plugins.limits.call_timeout_ms (30 s), so
// the next conversation's message waited 30 s per refused message. And
// the flood gets one notice, not one per message: the plugin runs one
// call at a time, so notices queued for another goroutine still held
// every poll behind one send each.
func TestChannelBacklogNoticesDoNotHoldThePoller(t *testing.T) {
	notices, release, done := make(chan map[string]string, 64), make(chan struct{}), make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		if strings.Contains(body["content"], "not delivered") {
			notices <- body
			// Hangs until released, like a tarpit the sender chose.
			select {
			case <-release:
			case <-done:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	fs := newFakeSessions()
	fs.holdFor["a0"] = make(chan struct{}) // A's turn runs on, and C's
	fs.holdFor["c0"] = fs.holdFor["a0"]
	ts := channelServerHook(t, fs, hook.URL)
	t.Cleanup(func() { close(done) }) // before the sandbox stops
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	// fill has thread's turn run on and 31 more wait behind it.
	fill := func(thread string, held int) {
		t.Helper()
		first := strings.ToLower(thread) + "0"
		postThread(t, web.Listen, thread, first)
		if p := testwait.Recv(t, fs.prompts); p.prompt != first {
			t.Fatalf("prompt %q, want %s", p.prompt, first)
		}
		for i := 1; i < 32; i++ {
			postThread(t, web.Listen, thread, fmt.Sprintf("%s%d", strings.ToLower(thread), i))
		}
		testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
			if n := pluginsandbox.ChannelPending(ts.Server, "web"); n != held {
				return fmt.Errorf("%d messages polled and undelivered, want %d", n, held)
			}
			return nil
		})
	}
	fill("A", 32)
	for i := 32; i < 40; i++ { // refused, each
		postThread(t, web.Listen, "A", fmt.Sprintf("a%d", i))
	}
	postThread(t, web.Listen, "B", "b1")
	if n := testwait.Recv(t, notices); n["thread_id"] != "A" {
		t.Fatalf("notice %v, want A's", n)
	}
	release <- struct{}{} // the first notice's send ends
	if p := testwait.Recv(t, fs.prompts); p.prompt != "b1" {
		t.Fatalf("prompt %q, want b1", p.prompt)
	}
	// Notices go out in order: once C's comes, A's flood has had all
	// it gets.
	fill("C", 64)
	postThread(t, web.Listen, "C", "c32")
	if n := testwait.Recv(t, notices); n["thread_id"] != "C" {
		t.Fatalf("notice %v, want C's: A's flood got a notice per refused message", n)
	}
}

// A turn in flight when its binding is removed (or the sandbox shuts
// down) is cut, and its sender is told so: the notice was suppressed
// because the binding was stopping, and the sender, told 202, heard
// nothing at all.
func TestChannelTurnCutByAnUnbindGetsANotice(t *testing.T) {
	ts, _, _, replies := m1RunsUntilTheUnbind(t)
	bindChannels(t, ts)
	r := testwait.Recv(t, replies)
	if r["recipient"] != "ann" || r["thread_id"] != "A" || !strings.Contains(r["content"], "not answered") {
		t.Fatalf("reply to a turn cut by an unbind: %v", r)
	}
}

// A turn in flight when its binding is rebuilt for the same plugin (its
// agent changed) is delivered again by the new binding, before the
// conversation's later messages, and answered: the sender, answered 202,
// was only told to send it again, which a webhook's sender cannot do,
// and the message was lost.
func TestChannelTurnCutByARebindIsDeliveredAgain(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	fs.answer = true
	cut := make(chan struct{})
	fs.hold = cut // the first Prompt of m1 runs until the binding stops
	ts := channelServerHook(t, fs, hook)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postThread(t, web.Listen, "A", "m1")
	if p := testwait.Recv(t, fs.prompts); p.prompt != "m1" || p.agent != "open" {
		t.Fatalf("first prompt %q to %q", p.prompt, p.agent)
	}
	postThread(t, web.Listen, "A", "m2") // waits behind m1
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		if n := pluginsandbox.ChannelPending(ts.Server, "web"); n != 2 {
			return fmt.Errorf("%d messages polled and undelivered, want m1 and m2", n)
		}
		return nil
	})
	bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "locked"})
	for _, want := range []string{"m1", "m2"} {
		if p := testwait.Recv(t, fs.prompts); p.prompt != want || p.agent != "locked" {
			t.Fatalf("prompt after the rebind %q to %q, want %s to locked", p.prompt, p.agent, want)
		}
		if r := testwait.Recv(t, replies); r["content"] != "re: "+want || r["thread_id"] != "A" {
			t.Fatalf("reply after the rebind: %v, want the answer to %s", r, want)
		}
	}
}

// A message delivered again after a rebind cut its turn carries the
// idempotency key it had (the session service resumes its turn rather
// than running it, and its tools, a second time); another message has
// another key, as has one of the same text without an id; and every
// session is opened with the alias's max_sessions, which the session
// service holds over every replica.
func TestChannelRedeliveryCarriesItsMessageKey(t *testing.T) {
	hook, replies := replyHook(t)
	fs := newFakeSessions()
	fs.answer = true
	cut := make(chan struct{})
	fs.hold = cut
	ts := channelServerHook(t, fs, hook)
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", MaxSessions: 40})["web"]
	postThread(t, web.Listen, "A", "m1")
	first := testwait.Recv(t, fs.prompts)
	if first.prompt != "m1" || first.key == "" || first.maxOpen != 40 {
		t.Fatalf("first prompt %+v, want m1 with a key, its session opened with max 40", first)
	}
	// A rebind (another bound, the same plugin and agent, so the same
	// session) cuts the turn and delivers it again.
	bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", MaxSessions: 41})
	again := testwait.Recv(t, fs.prompts)
	if again.prompt != "m1" || again.session != first.session || again.key != first.key || again.maxOpen != 41 {
		t.Fatalf("the delivery again %+v, want m1 to %s with key %s", again, first.session, first.key)
	}
	testwait.Recv(t, replies)
	web = bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", MaxSessions: 40})["web"]
	postThread(t, web.Listen, "A", "m2")
	for _, body := range []string{`{"from":"ann","text":"same","thread":"A"}`, `{"from":"ann","text":"same","thread":"A"}`} {
		if code := postMessage(t, web.Listen, body); code != http.StatusAccepted {
			t.Fatalf("post: %d", code)
		}
	}
	keys := map[string]bool{first.key: true}
	for range 3 {
		p := testwait.Recv(t, fs.prompts)
		if keys[p.key] || p.key == "" {
			t.Fatalf("prompt %+v has the key of another message", p)
		}
		keys[p.key] = true
	}
}

// A conversation whose reply endpoint hangs costs the others' replies
// time, never the replies themselves: the plugin runs one call at a
// time, and a call's plugins.limits.call_timeout_ms ran from when it
// was asked for, its wait for the instance included, so a reply asked
// for just after the hung one timed out with it, without running, and
// was dropped with a log line though its sender had been answered 202.
func TestChannelHungReplyEndpointDropsNoOtherReply(t *testing.T) {
	hookURL, hung, replies, release := hungThreadAHook(t)
	fs := newFakeSessions()
	fs.answer = true
	relA, relB := make(chan struct{}), make(chan struct{})
	fs.holdFor["a1"], fs.holdFor["b1"] = relA, relB
	lim := wasmhost.DefaultLimits()
	lim.CallTimeoutMS = 2000
	ts := channelServerHost(t, fs, hookURL, func(c *wasmhost.Config) { c.Limits = lim })
	t.Cleanup(release) // before the sandbox stops
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	postThread(t, web.Listen, "A", "a1")
	postThread(t, web.Listen, "B", "b1")
	for range 2 {
		testwait.Recv(t, fs.prompts)
	}
	close(relA)
	if th := testwait.Recv(t, hung)["thread_id"]; th != "A" {
		t.Fatalf("hung reply of %s, want A's", th)
	}
	close(relB) // b1's reply waits for the instance behind a1's
	if r := testwait.Recv(t, replies); r["content"] != "re: b1" || r["thread_id"] != "B" {
		t.Fatalf("reply %v, want b1's answer", r)
	}
}

// A binding removed while it holds messages it answered 202 for (polled
// and waiting behind a turn) tells each one's sender that it was not
// delivered: they were dropped with the binding, without a word, since
// no binding of the plugin takes them over.
func TestChannelUnbindTellsTheSendersOfWaitingMessages(t *testing.T) {
	ts, fs, web, replies := m1RunsUntilTheUnbind(t)
	postThread(t, web.Listen, "A", "m2")
	postThread(t, web.Listen, "B", "m3") // waits for no one: answered
	testwait.Recv(t, fs.prompts)
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		if n := pluginsandbox.ChannelPending(ts.Server, "web"); n != 2 {
			return fmt.Errorf("%d messages polled and undelivered, want m1 and m2", n)
		}
		return nil
	})
	bindChannels(t, ts)
	got := map[string]string{}
	for range 2 {
		r := testwait.Recv(t, replies)
		got[r["thread_id"]+" "+r["recipient"]] += r["content"] + "|"
	}
	a := got["A ann"]
	if !strings.Contains(a, "not answered") || !strings.Contains(a, "not delivered") {
		t.Fatalf("notices to ann on thread A after the unbind: %v, want m1's (not answered) and m2's (not delivered)", got)
	}
}

// A body the listener cannot read is said as such: any read error was
// answered 413 "a message is at most 1048576 bytes", so a sender whose
// body was malformed (a broken chunked encoding) or cut off was told to
// send less, which mends nothing. Only a body past the bound is 413.
func TestChannelUnreadableBodyIsNotTooLarge(t *testing.T) {
	ts := channelServer(t, newFakeSessions())
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open"})["web"]
	conn := dialWritten(t, web.Listen, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+chanToken+
		"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a malformed chunked body: %s %q, want 400", resp.Status, body)
	}
	if code := postMessage(t, web.Listen, `{"text":"`+strings.Repeat("x", 1<<20)+`"}`); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body past the bound: %d, want 413", code)
	}
}

// A port written with a leading zero is the same port: "127.0.0.1:08080"
// listens where "127.0.0.1:8080" does, and the two aliases were bound
// side by side (SO_REUSEPORT), the kernel spreading a sender's
// connections over both agents, as listenClashes exists to refuse. And
// "00", like "0", is a fresh port each, no clash.
func TestChannelsSharingAPortWrittenTwoWaysAreRefused(t *testing.T) {
	ts := channelServer(t, newFakeSessions())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	host, port, _ := net.SplitHostPort(addr)
	padded := net.JoinHostPort(host, "0"+port)
	got := bindChannels(t, ts,
		pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: addr, Agent: "open"},
		pluginsandbox.ChannelBinding{Alias: "web2", Plugin: "webhook", Listen: padded, Agent: "locked"})
	for alias, other := range map[string]string{"web": "web2", "web2": "web"} {
		if c := got[alias]; c == nil || c.State != "failed" || !strings.Contains(c.Reason, other) {
			t.Fatalf("channel %s on the port of %s written otherwise: %v", alias, other, c)
		}
	}
	got = bindChannels(t, ts,
		pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:00", Agent: "open"},
		pluginsandbox.ChannelBinding{Alias: "web2", Plugin: "webhook", Listen: "127.0.0.1:00", Agent: "locked"})
	for _, alias := range []string{"web", "web2"} {
		if c := got[alias]; c == nil || c.State != "running" {
			t.Fatalf("channel %s on a fresh port: %v", alias, c)
		}
	}
}

// hungThreadAHook is a channel's reply endpoint that holds each reply to
// thread A (its body sent on hung) until release or the request's end,
// and answers the others (their bodies sent on replies).
func hungThreadAHook(t *testing.T) (url string, hung, replies <-chan map[string]string, release func()) {
	held, answered, done := make(chan map[string]string, 8), make(chan map[string]string, 8), make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body["thread_id"] == "A" {
			held <- body
			select {
			case <-done:
			case <-r.Context().Done():
			}
			return
		}
		answered <- body
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	return hook.URL, held, answered, sync.OnceFunc(func() { close(done) })
}
