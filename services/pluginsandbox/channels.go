package pluginsandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"crypto/subtle"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/plugins/abi"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// Channel listener and hand-off bounds.
const (
	// maxInboundBody caps one message posted to a channel's listener.
	maxInboundBody = 1 << 20
	// inboundQueue bounds a channel's queued messages, and
	// inboundQueueBytes their bytes together; a full queue answers 503.
	// The count alone let one sender with the listener's token queue 256
	// messages of 1 MiB, 256 MiB an alias, past the heap the sandbox's
	// GOMEMLIMIT (416 MiB in the deployments) and its limit allow.
	inboundQueue      = 256
	inboundQueueBytes = 16 << 20
	// pollEvery drains a channel even without a new message (a rebuilt
	// instance, a configure that failed earlier).
	pollEvery = time.Second
	// pollBatch bounds the messages drained per wake-up.
	pollBatch = 64
	// awayWait bounds how long one message waits for a session service
	// that is away (whenAvailable), and a NewSession call. A turn itself
	// has no bound of the channel's: the agent's own bound it
	// (approval_timeout_secs, step_timeout_secs, timeout_secs). A fixed
	// five minutes here cancelled a channel turn whose approval the
	// operator had given longer, and answered in time, with no word to
	// the sender.
	awayWait = 5 * time.Minute
	// adoptEvery is how often a binding looks for the kept messages of
	// a replica that died (channel_spool.go).
	adoptEvery = 5 * time.Second
	// stopGrace is how long a stopping binding's sends (answers, and
	// notices to the senders of the turns it cuts) have, all together:
	// the binder's lock is held meanwhile.
	stopGrace = 5 * time.Second
)

// maxInboundConns bounds the connections a channel listener serves at
// once (boundConns); a variable so that a test may lower it.
var maxInboundConns = 512

// maxConversations bounds the conversations a channel delivers at once
// (deliveries); a variable so that a test may lower it.
var maxConversations = 8

// convBacklog bounds the messages of one conversation waiting behind its
// running turn; one more is refused with a notice, so that one sender
// cannot take the backlog that the other conversations share.
const convBacklog = 32

// noticeQueue bounds the refusals' notices waiting for a channel's
// notifier (deliveries.notices); one more is dropped with a log line.
const noticeQueue = 8

// channelPrincipal is who a channel acts as towards the session service:
// the operator principal, which the config service grants to the daemon's
// own processes. The operator chooses what a channel's senders reach by
// binding it to an agent (channels.plugin.<alias>.agent) and giving that
// agent only the tools it should offer them; approvals nobody on the
// channel can answer are denied when they time out.
func channelPrincipal() *commonv1.Principal {
	return &commonv1.Principal{PrincipalId: configschema.OperatorPrincipal, Operator: true}
}

// binder runs the channel bindings of channels.plugin.<alias>: for each,
// a wasmhost.Channel of the bound plugin (its own instance and instance
// key), the host listener that feeds its inbound queue, and a poller that
// drains it and hands each message to a session.
type binder struct {
	s     *Server
	mu    sync.Mutex // held across a binding's load and stop: seconds
	bound map[string]*binding
	// listed is what ListChannels reads, the bindings by alias as of the
	// last change (set under mu): a list never waits behind a binding
	// that is loading or stopping. An operator's plugins/list did, and
	// timed out while a channel plugin compiled on a loaded machine.
	listed atomic.Pointer[[]*binding]
}

func newBinder(s *Server) *binder { return &binder{s: s, bound: map[string]*binding{}} }

type binding struct {
	cfg    ChannelBinding
	entry  *entry
	reveal func(ctx context.Context, prop string) (string, error)
	tok    tokenCache
	ch     *wasmhost.Channel
	// inbound is what the listener queues for ch; a rebuilt binding of
	// the same plugin takes it over, so queued messages outlive the
	// binding that accepted them.
	inbound *wasmhost.InboundQueue
	// spool keeps what inbound and the backlog hold on disk (nil: in
	// memory only), so that a replica that dies leaves it to the next.
	spool *channelSpool
	// backlog is, before the poller runs, the messages polled but not
	// delivered by the binding this one replaces, and once it stopped,
	// this binding's own: the next binding of the same plugin takes them
	// over with inbound.
	backlog []*wasmhost.ChannelMessage
	// dl is the poller's deliveries (set before it starts).
	dl     *deliveries
	srv    *http.Server
	addr   string
	key    string
	notify chan struct{}
	cancel context.CancelFunc
	// sends is the context of the binding's sends through the plugin
	// (answers and notices): it outlives the poller's by stopGrace when
	// the binding stops, so that the senders of the turns the stop cuts
	// are told, and an answer being sent goes out.
	sends    context.Context
	endSends context.CancelFunc
	wg       sync.WaitGroup
	log      *zap.Logger

	// handover is set, before the binding stops, when a binding of the
	// same plugin takes over its queue and backlog (a rebind), or the
	// spool keeps them for the replica that follows (the sandbox stops,
	// binder.close): a turn the stop cuts then goes back to the backlog,
	// to be delivered again by the next binding, rather than being
	// answered with a notice to send it again.
	handover atomic.Bool

	// stalled, when set, is why the listener refuses new messages: the
	// plugin's own service holds a message the host refused for its
	// size, and nothing queued behind it is polled (failStalled).
	stalled atomic.Pointer[string]
	// admit orders the listener's admissions (read-held from the check
	// of stalled until the message is queued) with failStalled's
	// (write-held): a post is either queued before the failure, and
	// counted in its reason, or refused after it. Without it, a post
	// that passed the check as the binding failed was answered 202
	// after the failure, uncounted, to wait behind the held message.
	admit sync.RWMutex
	// heldKey is the refusalKey of that message, set by the poller and
	// read once it ended (b.wg): the binding that takes this one's queue
	// over knows the message, and does not tell its sender again.
	heldKey string

	mu     sync.Mutex
	state  string
	reason string
}

func (b *binding) set(state, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state, b.reason = state, reason
}

func (b *binding) status() (string, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.reason
}

// reconcile makes the running bindings match the catalog's settings and
// plugins: a binding whose settings or plugin changed is rebuilt, a failed
// one is retried.
func (bd *binder) reconcile(ctx context.Context, c *catalog) {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	want := map[string]ChannelBinding{}
	if c.live.Enabled {
		want = c.live.Channels
	}
	clashes := listenClashes(want)
	failed := map[string]string{}
	// kept are the inbound queues and backlogs of rebuilt bindings, by
	// alias: what their listeners accepted (202) is the next binding's to
	// deliver, as long as the same plugin reads it (the message's shape
	// is the plugin's).
	kept := map[string]*binding{}
	for alias, cur := range bd.bound {
		w, ok := want[alias]
		state, reason := cur.status()
		if state == channelFailed {
			failed[alias] = reason
		}
		// A binding failed on a message its plugin's service holds is
		// not retried: a new one of the same plugin and settings would
		// poll that message again (failStalled).
		retry := state == channelFailed && cur.stalled.Load() == nil
		if !ok || w != cur.cfg || c.channels[w.Plugin] != cur.entry || retry || clashes[alias] != "" {
			handover := ok && w.Plugin == cur.cfg.Plugin
			cur.handover.Store(handover)
			cur.stop()
			if handover {
				kept[alias] = cur
			}
			delete(bd.bound, alias)
			bd.publish()
		}
	}
	aliases := make([]string, 0, len(want))
	for alias := range want {
		aliases = append(aliases, alias)
	}
	sort.Strings(aliases)
	for _, alias := range aliases {
		if _, ok := bd.bound[alias]; ok {
			continue
		}
		b := bd.s.bind(ctx, want[alias], c.channels[want[alias].Plugin], clashes[alias], kept[alias])
		bd.bound[alias] = b
		bd.publish()
		// A failed binding is retried at every scan: log it once per reason.
		if state, reason := b.status(); state == channelFailed && failed[alias] != reason {
			b.log.Warn("channel binding failed", zap.String("reason", reason))
		}
	}
	// A spool no binding uses any more (an unbind, the alias moved to
	// another plugin) is closed: its lock held until the process ended,
	// so clawmesh spool drop was refused for an alias no longer bound,
	// and the spool's folder stayed, empty, until a restart.
	inUse := make(map[spoolKey]bool, len(bd.bound))
	for alias, b := range bd.bound {
		inUse[spoolKey{alias, b.cfg.Plugin}] = true
	}
	bd.s.closeSpoolsBut(inUse)
}

// close stops every binding: the sandbox stops. A binding with a spool
// hands what it accepted over to the replica that follows (this one
// restarted, or another of the alias's): the turns the stop cuts, its
// backlog and its queue stay on disk, to be delivered again with their
// idempotency keys, and their senders are told nothing. Abandoned (as an
// unbind does), an orderly stop told every sender answered 202 to send
// its message again, which a webhook cannot, and dropped the message
// from the spool that was there to keep it.
func (bd *binder) close(context.Context) {
	bd.mu.Lock()
	defer bd.mu.Unlock()
	for alias, b := range bd.bound {
		if b.spool != nil {
			b.handover.Store(true)
		}
		b.stop()
		delete(bd.bound, alias)
	}
	bd.publish()
}

// publish makes the bindings in bd.bound the listed ones; bd.mu is held.
func (bd *binder) publish() {
	l := make([]*binding, 0, len(bd.bound))
	for _, b := range bd.bound {
		l = append(l, b)
	}
	sort.Slice(l, func(i, j int) bool { return l[i].cfg.Alias < l[j].cfg.Alias })
	bd.listed.Store(&l)
}

// listenClashes names, by alias, the bindings that listen where another
// does: one fixed port of one host, or of every interface. Each replica
// listens with SO_REUSEPORT (so that replicas share an address), which
// lets two aliases of one replica bind the same address too; the kernel
// then spread a sender's connections over both, so its messages reached
// either agent at random. Like two plugins of one name, all parties are
// refused, never the first come.
func listenClashes(want map[string]ChannelBinding) map[string]string {
	type at struct{ host, port string }
	where := map[string]at{}
	for alias, w := range want {
		host, p, err := net.SplitHostPort(w.Listen)
		n, perr := strconv.Atoi(p)
		if err != nil || perr != nil || n == 0 {
			continue // validate says what is wrong; port 0 is a fresh port
		}
		// By number: "08080" listens where "8080" does.
		port := strconv.Itoa(n)
		if host == "localhost" {
			host = "127.0.0.1"
		}
		if ip := net.ParseIP(host); ip != nil {
			if ip.IsUnspecified() {
				host = ""
			} else {
				host = ip.String()
			}
		}
		where[alias] = at{host, port}
	}
	out := map[string]string{}
	for alias, a := range where {
		var others []string
		for other, o := range where {
			if other != alias && o.port == a.port && (o.host == a.host || o.host == "" || a.host == "") {
				others = append(others, "channels.plugin."+other)
			}
		}
		if len(others) > 0 {
			sort.Strings(others)
			out[alias] = fmt.Sprintf("channels.plugin.%s.listen %s is also where %s listens; give each channel its own address",
				alias, want[alias].Listen, strings.Join(others, ", "))
		}
	}
	return out
}

// Channel binding states.
const (
	channelRunning = "running"
	channelFailed  = "failed"
)

// bind starts one binding; a failure is recorded on the binding (and
// retried at the next scan), never fatal. A non-empty clash refuses it
// (listenClashes). prev is the stopped binding it replaces, whose queue
// and backlog it takes over; nil for a new one.
func (s *Server) bind(ctx context.Context, cfg ChannelBinding, e *entry, clash string, prev *binding) *binding {
	inbound := wasmhost.NewInboundQueue(inboundQueue, inboundQueueBytes)
	var backlog []*wasmhost.ChannelMessage
	heldKey := ""
	if prev != nil {
		inbound, backlog, heldKey = prev.inbound, prev.backlog, prev.heldKey
	}
	b := &binding{cfg: cfg, entry: e, inbound: inbound, backlog: backlog, heldKey: heldKey, notify: make(chan struct{}, 1), reveal: s.cfg.Reveal,
		log: s.logger.With(zap.String("channel", cfg.Alias), zap.String("plugin", cfg.Plugin))}
	fail := func(err error) *binding {
		b.set(channelFailed, err.Error())
		b.stop()
		return b
	}
	if err := cfg.validate(); err != nil {
		return fail(err)
	}
	// 202 promises the message outlives this process: without the
	// spool the listener answers nothing.
	sp, err := s.spool(cfg.Alias, cfg.Plugin)
	if err != nil {
		return fail(err)
	}
	b.spool = sp
	if clash != "" {
		return fail(errors.New(clash))
	}
	if e == nil {
		return fail(fmt.Errorf("no loaded channel plugin %s", cfg.Plugin))
	}
	m := e.bundle.Manifest
	b.key = wasmhost.InstanceKey(m.Name, wasmhost.WorldChannel, cfg.Alias)
	ch, err := s.cfg.Host.LoadChannel(ctx, wasmhost.PluginSpec{
		Name: m.Name, Version: m.Version, Wasm: e.wasm, Grants: s.cfg.Grant(m), Schema: m.Schema(),
		Config: s.cfg.ConfigSource, Binding: cfg.Alias, InstanceKey: b.key,
	}, b.inbound)
	if err != nil {
		return fail(fmt.Errorf("load channel: %w", err))
	}
	ch.SetPollContentBytes(cfg.maxContentBytes())
	b.ch = ch
	lis, err := listenReusePort(ctx, cfg.Listen)
	if err != nil {
		return fail(fmt.Errorf("listen %s: %w", cfg.Listen, err))
	}
	b.addr = lis.Addr().String()
	lis = boundConns(lis, maxInboundConns)
	b.srv = &http.Server{
		Handler:           http.HandlerFunc(b.serveInbound),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(b.log),
	}
	pctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.sends, b.endSends = context.WithCancel(context.Background())
	b.dl = &deliveries{s: s, b: b, ctx: pctx, freed: make(chan struct{}, 1), convs: map[string][]*wasmhost.ChannelMessage{},
		noticed: map[string]bool{}, notices: make(chan backlogNotice, noticeQueue)}
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		if err := b.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.log.Warn("channel listener stopped", zap.Error(err))
		}
	}()
	go func() {
		defer b.wg.Done()
		s.poll(pctx, b)
	}()
	b.set(channelRunning, "")
	b.log.Info("channel bound", zap.String("listen", b.addr), zap.String("agent", cfg.Agent), zap.String("instance_key", b.key))
	return b
}

// stop closes the listener, ends the poller and its deliveries (what
// they had not begun stays in b.backlog; the senders of the turns they
// cut are told, within stopGrace) and unloads the channel.
func (b *binding) stop() {
	if b.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := b.srv.Shutdown(ctx); err != nil {
			// A request still sending (a slow or hostile sender) kept
			// its connection past the graceful stop, and was answered
			// 202 afterwards for a queue of a binding already gone:
			// close what is left.
			_ = b.srv.Close()
		}
		cancel()
	}
	var grace *time.Timer
	if b.cancel != nil {
		b.cancel()
		grace = time.AfterFunc(stopGrace, b.endSends)
	}
	b.wg.Wait()
	if grace != nil {
		grace.Stop()
		b.endSends()
	}
	if b.ch != nil {
		_ = b.ch.Close(context.Background())
	}
}

// serveInbound is the host listener: a POST of one JSON object is queued
// for the plugin, which turns it into a message from its poll-message
// export. The object's shape is the plugin's business (the webhook
// example reads {"id","from","text","thread"}).
//
// Every request must carry "Authorization: Bearer <token>" with the
// binding's channels.plugin.<alias>.token, read from the config service
// after the request arrived (reads shared, tokenCache) and compared in
// constant time: a loopback port is reachable by every local account.
// A rotation holds from its commit, not from the replica's read of it,
// for the old token and the new alike (and while the config service is
// away a message is answered 503, to retry, neither taken on a token
// that may have been rotated nor refused on one that may be new).
func (b *binding) serveInbound(w http.ResponseWriter, r *http.Request) {
	// The body is read while the token is checked: the server sees a
	// sender leave only once its body was read, so one that announced a
	// body, sent part of it and left while its token waited (for the gap
	// between reads, or a read in flight) held its handler and one of the
	// bounded connections until the wait ended. Its read failing ends the
	// wait. What it reads is what the handler reads after a right token
	// (maxInboundBody at most).
	ctx, gone := context.WithCancel(r.Context())
	defer gone()
	body := readAhead(w, r.Body, gone)
	ok, err := b.authorized(ctx, r)
	// Whether the sender left is settled before a refusal ends the
	// connection's reads: the deadline below also fails net/http's own
	// read past a whole body, which cancels r.Context() as a departure
	// does, and a refused sender still there got an empty 200.
	left := r.Context().Err() != nil || (err != nil && ctx.Err() != nil)
	if !ok || err != nil {
		// Nothing more is read from a sender not taken: its read ends
		// now, and so does the connection.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		w.Header().Set("Connection", "close")
	}
	<-body.done
	if left {
		// The sender left while its token waited (its body broke off,
		// or it had sent it whole): no one to answer.
		return
	}
	if err != nil {
		// The config service is away: the token may well be right, and
		// 401 told the sender to send the one it had sent.
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the channel cannot check its token now; retry later", http.StatusServiceUnavailable)
		return
	}
	if !ok {
		// Kept alive, an unauthenticated client held one of the bounded
		// connections (boundConns) a minute per request.
		w.Header().Set("Connection", "close")
		w.Header().Set("WWW-Authenticate", `Bearer realm="clawmesh channel"`)
		http.Error(w, "unauthorized: send Authorization: Bearer <channels.plugin."+b.cfg.Alias+".token>", http.StatusUnauthorized)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a JSON object", http.StatusMethodNotAllowed)
		return
	}
	b.admit.RLock()
	defer b.admit.RUnlock()
	if why := b.stalled.Load(); why != nil {
		// Accepted, it would wait behind the held message with no
		// poll to reach it: refused before it is taken, as a full
		// spool refuses. The operator's replacing the plugin or
		// rebinding the alias ends it.
		w.Header().Set("Retry-After", "60")
		http.Error(w, *why, http.StatusServiceUnavailable)
		return
	}
	if admitHook != nil {
		admitHook()
	}
	raw, err := body.raw, body.err
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		http.Error(w, fmt.Sprintf("a message is at most %d bytes", maxInboundBody), http.StatusRequestEntityTooLarge)
		return
	}
	if err != nil {
		// Malformed (a broken chunked encoding) or cut off: 413 told
		// the sender to send less, which mended nothing.
		http.Error(w, "the body could not be read whole: "+err.Error(), http.StatusBadRequest)
		return
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		http.Error(w, "the body must be a JSON object", http.StatusBadRequest)
		return
	}
	// On disk before the 202: a replica that dies holding the message
	// leaves it to the next one (channel_spool.go).
	kept, err := b.spool.write(raw, b.cfg.spoolMaxBytes())
	if errors.Is(err, errSpoolFull) {
		// Refused before it is taken: what was answered 202 is never
		// dropped to make room. Delivery drains the spool at the pace
		// of turns, seconds a message, hence the longer wait.
		w.Header().Set("Retry-After", "30")
		http.Error(w, fmt.Sprintf("the channel's spool of messages accepted and not delivered yet is at its bound, %s (channels.plugin.%s.spool_max_mb): it takes new messages again once it has delivered some; retry later",
			mib(b.cfg.spoolMaxBytes()), b.cfg.Alias), http.StatusServiceUnavailable)
		return
	}
	if err != nil {
		b.log.Warn("channel message refused: not kept", zap.Error(err))
		w.Header().Set("Retry-After", "5")
		http.Error(w, "the channel cannot keep the message now; retry later", http.StatusServiceUnavailable)
		return
	}
	if err := b.inbound.PushTagged(json.RawMessage(raw), kept); err != nil {
		b.spool.drop(kept)
		http.Error(w, "the channel's queue is full; retry later", http.StatusServiceUnavailable)
		return
	}
	select {
	case b.notify <- struct{}{}:
	default:
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{"queued":true}` + "\n"))
}

// mib is n bytes in MiB, as spool_max_mb sets it.
func mib(n int64) string { return strconv.FormatInt(n>>20, 10) + " MiB" }

// authorized checks the request's bearer token against the binding's;
// an error is the binding's token that could not be read, or the
// request's end while it waited for a read.
func (b *binding) authorized(ctx context.Context, r *http.Request) (bool, error) {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got == "" || b.reveal == nil {
		return false, nil
	}
	// The config service's own token, read after the request arrived,
	// decides. One held as of the revision the replica follows trailed a
	// rotation's commit by the announcement's round trip (at worst the
	// 30 s resync): the old token was taken meanwhile, after config/set
	// had answered, and the new one refused (401), so a client that set
	// a token and posted at once was told its token was wrong. What a
	// wrong token costs is one share of a read: requests check together
	// (one read in flight at a time, tokenCache.fresh), each refusal
	// ends its connection, and a token other than the one last read
	// waits for a read begun wrongTokenGap after the one before: wrong
	// tokens sent in a loop make ten reads a second at most.
	want, err := b.tok.fresh(ctx, b, time.Now(), got)
	if err != nil {
		return false, fmt.Errorf("read channels.plugin.%s.token: %w", b.cfg.Alias, err)
	}
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1, nil
}

// inboundBody is a request's body read beside its token's check.
type inboundBody struct {
	done chan struct{} // closed once raw and err are set
	raw  []byte
	err  error
}

// readAhead reads body (maxInboundBody at most, MaxBytesReader's error
// past it) in a goroutine; a read that fails but for the size (the
// sender gone, or a read ended by the handler's deadline) calls gone.
// The handler waits for done before it answers.
func readAhead(w http.ResponseWriter, body io.Reader, gone func()) *inboundBody {
	in := &inboundBody{done: make(chan struct{})}
	rd := http.MaxBytesReader(w, io.NopCloser(body), maxInboundBody)
	go func() {
		defer close(in.done)
		in.raw, in.err = io.ReadAll(rd)
		if isDeparture(in.err) {
			gone()
		}
	}()
	return in
}

// isDeparture says a body's read failed as its sender's leaving does
// (the connection closed or reset before the body's end), not on a
// body too large.
func isDeparture(err error) bool {
	tooLarge := (*http.MaxBytesError)(nil)
	return err != nil && !errors.As(err, &tooLarge)
}

// tokenWarnEvery bounds how often a token that cannot be read is logged:
// every request that needs it may fail alike.
const tokenWarnEvery = 30 * time.Second

// wrongTokenGap is the least time between the start of a read of the
// token and the next one a token other than the one last read begins.
// Each wrong token, sent one after the other, made a read of its own on
// the config service, as fast as the sender could loop. It cannot be
// refused from the last read alone: a token set a moment ago is one
// other than the last read too, and must be taken at once, so it waits
// for the next read, this long at most.
// A variable so that a test may lengthen it.
var wrongTokenGap = 100 * time.Millisecond

// tokenWaitHook, when set (tests), is called as a request begins to wait
// for wrongTokenGap.
var tokenWaitHook func()

// tokenCache shares a binding's reads of its token: a Reveal per
// request, each in flight at once, let any client that reached the
// listener, token or not, make as many calls on the config service as it
// held connections (512), and a warning per request while it was away.
type tokenCache struct {
	mu     sync.Mutex
	call   *tokenRead // the read in flight, if any
	prev   *tokenRead // the last read done, if any
	warned time.Time
}

type tokenRead struct {
	done    chan struct{}
	started time.Time
	token   string
	err     error
}

// fresh returns b's token as the config service holds it, read by a call
// begun at or after arrived: requests that arrive together share one
// read (one in flight at a time), and none takes a read begun before it
// arrived, which may predate a rotation it follows. A request whose
// token, got, is not the one last read begins a read only wrongTokenGap
// after the last began; meanwhile it waits, and takes any read begun
// after it arrived.
//
// Its waits, for the gap and for a read in flight, end with ctx, the
// request's: a sender that left while it waited held its handler, and
// one of the listener's bounded connections, for the rest of the wait.
// The read itself is every waiter's and goes on without it.
func (c *tokenCache) fresh(ctx context.Context, b *binding, arrived time.Time, got string) (string, error) {
	for {
		c.mu.Lock()
		if p := c.prev; p != nil && !p.started.Before(arrived) {
			c.mu.Unlock()
			return p.token, p.err
		}
		call := c.call
		if call == nil {
			if p := c.prev; p != nil && subtle.ConstantTimeCompare([]byte(got), []byte(p.token)) != 1 {
				if wait := time.Until(p.started.Add(wrongTokenGap)); wait > 0 {
					c.mu.Unlock()
					if tokenWaitHook != nil {
						tokenWaitHook()
					}
					t := time.NewTimer(wait)
					select {
					case <-t.C:
					case <-ctx.Done():
						t.Stop()
						return "", context.Cause(ctx)
					}
					continue
				}
			}
			call = c.begin()
			c.mu.Unlock()
			c.read(b, call)
			return call.token, call.err
		}
		c.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
		if !call.started.Before(arrived) {
			return call.token, call.err
		}
	}
}

// begin makes the read in flight; c.mu is held.
func (c *tokenCache) begin() *tokenRead {
	call := &tokenRead{done: make(chan struct{}), started: time.Now()}
	c.call = call
	return call
}

// read makes call's Reveal, then ends it: under c.mu, c.call is cleared;
// then its waiters are woken.
func (c *tokenCache) read(b *binding, call *tokenRead) {
	// Not the request's context: the read is every waiting request's.
	// Bounded as every per-request call on the config service is.
	ctx, cancel := configclient.Bounded(context.Background())
	call.token, call.err = b.reveal(ctx, "channels.plugin."+b.cfg.Alias+".token")
	call.err = configclient.NoAnswer(ctx, call.err)
	cancel()
	c.mu.Lock()
	c.call, c.prev = nil, call
	if call.err != nil {
		if now := time.Now(); now.Sub(c.warned) >= tokenWarnEvery {
			c.warned = now
			b.log.Warn("channel token not read (logged at most every 30 s)", zap.Error(call.err))
		}
	}
	c.mu.Unlock()
	close(call.done)
}

// poll configures the channel (retrying until its config resolves) and
// drains its messages into b.dl, which delivers them. It polls only while
// the backlog has room: past it, the inbound queue fills and senders get
// 503, so polled messages are bounded as queued ones are.
func (s *Server) poll(ctx context.Context, b *binding) {
	d := b.dl
	seed := b.backlog
	notified := make(chan struct{})
	go func() {
		defer close(notified)
		for n := range d.notices {
			b.notice(n.msg, n.text)
		}
	}()
	// A refused message the previous binding of the plugin polled last
	// is known: its sender was told, and an answer of it again is not
	// a new refusal. So is this one's, for the binding that follows.
	refusals := pollRefusals{last: b.heldKey}
	defer func() {
		b.heldKey = refusals.last
		if refusals.later != nil {
			refusals.later.Stop()
		}
	}()
	defer func() {
		// Every delivery and the notifier are owned here: the
		// binding's stop (unbind, rebind, shutdown) returns once none
		// runs, and what no delivery had begun is the next binding's.
		d.wg.Wait()
		close(d.notices) // only the poller adds
		<-notified
		b.backlog = append(d.remainder(), seed...)
		if !b.handover.Load() {
			b.abandon()
		}
	}()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	info := wasmhost.CallInfo{Principal: "channel:" + b.cfg.Alias}
	configured := false
	lastErr := ""
	// The messages of a replica that died (this one's previous process,
	// or another replica's) are looked for at once, then every
	// adoptEvery: another replica may die at any time.
	var adopted time.Time
	for {
		if time.Since(adopted) >= adoptEvery {
			adopted = time.Now()
			b.spool.adopt(b.inbound)
			b.spool.settle(b.cfg.spoolMaxBytes())
		}
		select {
		case <-ctx.Done():
			return
		case <-b.notify:
		case <-d.freed:
		case <-t.C:
		case <-refusals.due():
		}
		if refusals.held() {
			continue // failed: polled at its backoff (pollLater)
		}
		if !configured {
			if err := b.ch.Configure(ctx, info); err != nil {
				if err.Error() != lastErr {
					b.log.Warn("channel configure failed; retrying", zap.Error(err))
					lastErr = err.Error()
				}
				b.set(channelRunning, "configure: "+err.Error())
				continue
			}
			configured, lastErr = true, ""
			b.set(channelRunning, "")
			// The previous binding's backlog goes first: it was
			// polled before anything the queue still holds.
			for _, msg := range seed {
				d.add(msg)
			}
			seed = nil
		}
		for range pollBatch {
			if !d.room() {
				break
			}
			polled := time.Now()
			msg, read, err := b.pollOne(ctx)
			if refused := (*wasmhost.PollRefusedError)(nil); errors.As(err, &refused) && ctx.Err() == nil {
				if b.pollRefused(ctx, refused, read, polled, &refusals) {
					continue // a new message: the next may wait behind it
				}
				break
			}
			if err != nil {
				if ctx.Err() == nil {
					b.log.Warn("channel poll failed", zap.Error(err))
				}
				if refusals.stuck {
					// Still failed (its service away, say):
					// not polled every tick meanwhile.
					refusals.pollLater()
				}
				break
			}
			refusals.clear(b)
			if msg == nil {
				break
			}
			d.add(msg)
		}
	}
}

// pollOne asks the plugin for its next message, gives it its host id
// when the plugin gave it none (hostMessageID), and ties it to the
// spool's files of the queued messages the plugin read for it (read). A
// queued message the plugin read into nothing (or refused, or one the
// host refused for its size) is done with; one a poll cut by the
// binding's stop read stays on disk, for the next owner.
func (b *binding) pollOne(ctx context.Context) (*wasmhost.ChannelMessage, []string, error) {
	msg, err := b.ch.PollMessage(ctx, wasmhost.CallInfo{Principal: "channel:" + b.cfg.Alias})
	read := b.inbound.TakePopped()
	switch {
	case err != nil && ctx.Err() != nil:
	case err != nil:
		b.spool.drop(read...)
	default:
		hostMessageID(msg, read)
		b.spool.polled(msg, read)
	}
	return msg, read, err
}

// deliveries hands a binding's polled messages to sessions: the messages
// of one conversation in order, one at a time (its session runs one turn
// at a time), and up to maxConversations conversations at once. One at a
// time for the whole channel, a turn waiting on an approval (which may
// take the agent's approval_timeout_secs, up to a day) held every other
// conversation of the channel, and the full queue then answered 503 to
// every sender.
type deliveries struct {
	s   *Server
	b   *binding
	ctx context.Context // the poller's: done when the binding stops
	wg  sync.WaitGroup  // the running workers
	// freed wakes the poller when a delivery ended (the backlog has room).
	freed chan struct{}

	mu sync.Mutex
	// convs are the messages of each conversation that is delivering
	// (its head is the one in delivery) or waiting for a worker.
	convs map[string][]*wasmhost.ChannelMessage
	// waiting are the conversations waiting for a worker, oldest first.
	waiting []string
	running int
	// held and heldBytes count the messages in convs; the poller takes
	// no more past inboundQueue and inboundQueueBytes.
	held      int
	heldBytes int
	// noticed are the conversations whose sender was told of a refusal
	// since their backlog last had room: one notice per full backlog,
	// not one per refused message.
	noticed map[string]bool
	// notices are the refusals' notices, which the poller's notifier
	// sends (noticeQueue at most wait). The poller sent each itself: a
	// send takes up to plugins.limits.call_timeout_ms (30 s) when the
	// plugin's endpoint hangs, and a sender flooding its conversation
	// held up the polling of every other for as long, per message.
	notices chan backlogNotice
}

// backlogNotice is the notice of a message that its conversation's backlog
// refused.
type backlogNotice struct {
	msg  *wasmhost.ChannelMessage
	text string
}

// conversation is the key of msg's conversation: its thread, else its
// sender, each in a key space of its own. Keyed by the bare thread or
// sender, a message on thread "bob" went to the session of sender "bob"
// writing without a thread, and the agent answered a stranger from bob's
// history. A thread keeps its bare id (so that its session is the one it
// had); a sender's key, and a thread's beginning with NUL, start with a
// NUL that no bare thread key has, so no two meet. Conversations without
// a thread started afresh once with this change.
func conversation(msg *wasmhost.ChannelMessage) string {
	switch {
	case msg.ThreadID == "":
		return "\x00sender\x00" + msg.Sender
	case strings.HasPrefix(msg.ThreadID, "\x00"):
		return "\x00thread\x00" + msg.ThreadID
	}
	return msg.ThreadID
}

// msgBytes is about what msg holds in memory.
func msgBytes(msg *wasmhost.ChannelMessage) int {
	return len(msg.ID) + len(msg.Sender) + len(msg.ReplyTarget) + len(msg.Content) + len(msg.ThreadID)
}

// room reports whether the backlog takes another message.
func (d *deliveries) room() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.held < inboundQueue && d.heldBytes < inboundQueueBytes
}

// add queues msg behind its conversation and starts a worker for a
// conversation that has none, within maxConversations.
func (d *deliveries) add(msg *wasmhost.ChannelMessage) {
	if !validMessageID(msg.ID) {
		// Its key (messageKey) could be another message's, which
		// would be answered in its place.
		d.b.log.Warn("channel message refused: the plugin gave it an id that is too long or holds control characters",
			zap.Int("id_bytes", len(msg.ID)))
		d.b.spool.done(msg)
		select {
		case d.notices <- backlogNotice{msg, badMessageID}:
		default:
			d.b.log.Warn("channel notice dropped: too many notices waiting")
		}
		return
	}
	conv := conversation(msg)
	d.mu.Lock()
	msgs, known := d.convs[conv]
	if len(msgs) >= convBacklog {
		// The plugin runs one call at a time, so even off the poller a
		// notice per message of a flood held every poll behind one
		// send: the sender hears once per full backlog.
		told := d.noticed[conv]
		d.noticed[conv] = true
		d.mu.Unlock()
		log := d.b.log.With(zap.String("message_id", msg.ID), zap.Int("waiting", len(msgs)))
		if told {
			log.Warn("channel message refused: its conversation has too many waiting (its sender was told at the first)")
			d.b.spool.done(msg)
			return
		}
		log.Warn("channel message refused: its conversation has too many waiting")
		// Refused for good: a replica that dies after this owes it
		// no second delivery.
		d.b.spool.done(msg)
		select {
		case d.notices <- backlogNotice{msg, fmt.Sprintf("This message was not delivered: %d earlier messages of this conversation are still waiting for the agent, and until it answers one, more are not delivered either; send them again later.", len(msgs))}:
		default:
			log.Warn("channel notice dropped: too many notices waiting")
		}
		return
	}
	d.convs[conv] = append(msgs, msg)
	d.held++
	d.heldBytes += msgBytes(msg)
	if !known {
		if d.running < maxConversations {
			d.running++
			d.wg.Add(1)
			go d.work(conv)
		} else {
			d.waiting = append(d.waiting, conv)
		}
	}
	d.mu.Unlock()
}

// work delivers conv's messages until it has none, then takes the oldest
// waiting conversation, until none waits or the binding stops.
func (d *deliveries) work(conv string) {
	defer d.wg.Done()
	for {
		d.mu.Lock()
		msgs := d.convs[conv]
		if len(msgs) == 0 || d.ctx.Err() != nil {
			if len(msgs) == 0 {
				delete(d.convs, conv)
			}
			if d.ctx.Err() != nil || len(d.waiting) == 0 {
				d.running--
				d.mu.Unlock()
				return
			}
			conv = d.waiting[0]
			d.waiting = d.waiting[1:]
			d.mu.Unlock()
			continue
		}
		msg := msgs[0]
		d.mu.Unlock()
		if !d.s.deliver(d.ctx, d.b, msg) {
			// The binding's stop cut the turn and the next binding
			// takes the backlog over: msg stays at its
			// conversation's head (remainder), to be delivered again.
			d.mu.Lock()
			d.running--
			d.mu.Unlock()
			return
		}
		d.b.spool.done(msg)
		d.mu.Lock()
		msgs = d.convs[conv]
		msgs[0] = nil
		d.convs[conv] = msgs[1:]
		delete(d.noticed, conv) // its backlog has room again
		d.held--
		d.heldBytes -= msgBytes(msg)
		d.mu.Unlock()
		select {
		case d.freed <- struct{}{}:
		default:
		}
	}
}

// remainder is what no delivery began, each conversation in order; the
// workers have ended.
func (d *deliveries) remainder() []*wasmhost.ChannelMessage {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*wasmhost.ChannelMessage
	for _, msgs := range d.convs {
		out = append(out, msgs...)
	}
	return out
}

// pending is the number of messages polled and not yet delivered.
func (d *deliveries) pending() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.held
}

// abandon tells the sender of every message the stopping binding still
// holds (polled and waiting, or queued for the plugin) that it was not
// delivered: no binding takes them over (the alias was removed or bound
// to another plugin, or the sandbox stops without a spool), and they
// were dropped with the binding without a word to senders answered 202.
// The notices share the stop's grace (b.sends); what it leaves is
// logged.
func (b *binding) abandon() {
	msgs := b.backlog
	b.backlog = nil
	told := 0
	for _, msg := range msgs {
		if b.sends.Err() != nil {
			break
		}
		b.notice(msg, notDelivered)
		b.spool.done(msg)
		told++
	}
	for told == len(msgs) && b.sends.Err() == nil && b.inbound.Pending() > 0 {
		msg, read, err := b.pollOne(b.sends)
		if refused := (*wasmhost.PollRefusedError)(nil); errors.As(err, &refused) && len(read) > 0 {
			b.notice(refused.Msg, refusedNotice(refused))
			continue
		}
		if err != nil || msg == nil {
			break
		}
		b.notice(msg, notDelivered)
		b.spool.done(msg)
	}
	left := len(msgs) - told + b.inbound.Pending()
	switch {
	case left == 0:
	case b.spool != nil:
		// Not dropped: their files stay, and a binding of the alias
		// to this plugin adopts them. A channel whose plugin's service
		// held a refused message leaves everything queued behind it
		// here: the plugin reads none of it.
		b.log.Warn("channel messages left in the spool by their binding, their senders not told: a binding of the alias to this plugin delivers them, or clawmesh spool drop drops them",
			zap.Int("messages", left))
	default:
		b.log.Warn("channel messages dropped with their binding, their senders not told", zap.Int("messages", left))
	}
}

// badMessageID is the notice for a message whose id validMessageID
// refuses.
const badMessageID = "This message was not delivered: its id is too long or holds control characters."

// notDelivered is the notice for a message a stopping binding held and
// no binding takes over.
const notDelivered = "This message was not delivered: the channel was reconfigured or stopped before the agent read it; send it again."

// notice answers msg with text through the plugin (a message that gets
// no answer of the agent's: its sender was told 202). A binding that is
// stopping sends it within stopGrace (b.sends).
func (b *binding) notice(msg *wasmhost.ChannelMessage, text string) {
	to := msg.ReplyTarget
	if to == "" {
		to = msg.Sender
	}
	if to == "" || b.sends.Err() != nil {
		return
	}
	nctx, cancel := context.WithTimeout(b.sends, 30*time.Second)
	defer cancel()
	if err := b.ch.Send(nctx, wasmhost.CallInfo{Principal: "channel:" + b.cfg.Alias}, wasmhost.SendMessage{Recipient: to, Content: text, ThreadID: msg.ThreadID}); err != nil {
		b.log.Warn("channel notice failed", zap.String("message_id", msg.ID), zap.Error(err))
	}
}

// deliver hands one message to the session of its conversation and sends
// the turn's answer back through the channel. It reports false, having
// told the sender nothing, when the binding's stop cut the delivery
// before the agent answered and a binding of the same plugin takes the
// backlog over (handover): the message is that binding's to deliver
// again. The sender was answered 202, and a rebind told it to send the
// message again, which a webhook or a chat service's sender cannot do.
// Delivered again, the message carries the same idempotency key
// (messageKey): the session service resumes the cut turn, whose tools
// that ran do not run again, or answers with the turn it finished.
//
// The session id derives from the binding (alias, plugin and agent) and
// the message's thread (or sender), so every replica picks the same
// session for one conversation.
// The agent is part of it because the session service resumes a session
// with the agent it was created for: without it, a channel rebound to
// another agent kept answering every known thread with the old one, and
// its tools.
func (s *Server) deliver(ctx context.Context, b *binding, msg *wasmhost.ChannelMessage) bool {
	s.observe(abi.ObserverChannelReceived, map[string]string{"channel": b.cfg.Alias, "plugin": b.cfg.Plugin, "message_id": msg.ID})
	log := b.log.With(zap.String("message_id", msg.ID))
	if s.cfg.Sessions == nil {
		log.Warn("channel message dropped: no session service")
		return true
	}
	conv := conversation(msg)
	to := msg.ReplyTarget
	if to == "" {
		to = msg.Sender
	}
	// notify answers a message that gets no answer of the agent's. The
	// reason stays in the log: it may name the operator's agents and
	// sessions.
	notify := func(text string) { b.notice(msg, text) }
	// unanswered tells why a session did not answer, and reports
	// whether the message is done with. The binding's stop (an unbind,
	// a rebind, the sandbox's shutdown) cuts its turns in flight: their
	// notices were suppressed with the stop, so the sender, told 202,
	// never heard of its message again. A rebind hands them over.
	unanswered := func() bool {
		if ctx.Err() != nil {
			if b.handover.Load() {
				log.Info("channel message cut by the binding's stop; the next binding delivers it again")
				return false
			}
			notify(cutShort)
			return true
		}
		notify(noAnswer)
		return true
	}
	sum := sha256.Sum256([]byte(b.cfg.Alias + "\x00" + b.cfg.Plugin + "\x00" + b.cfg.Agent + "\x00" + conv))
	sessionID := "chan_" + hex.EncodeToString(sum[:16])
	p := channelPrincipal()
	var resp *sessionv1.PromptResponse
	for reopens := 0; ; reopens++ {
		if err := whenAvailable(ctx, log, func() error {
			ctx, cancel := context.WithTimeout(ctx, awayWait)
			defer cancel()
			_, err := s.cfg.Sessions.NewSession(ctx, &sessionv1.NewSessionRequest{
				Principal: p, AgentAlias: b.cfg.Agent, SessionId: sessionID, InteractionSurface: "channel:" + b.cfg.Alias,
				MaxOpenOfSurface: int32(b.cfg.maxSessions()),
			})
			return err
		}); err != nil {
			log.Warn("channel message: no session", zap.Error(err))
			return unanswered()
		}
		err := whenAvailable(ctx, log, func() (err error) {
			resp, err = s.cfg.Sessions.Prompt(ctx, &sessionv1.PromptRequest{Principal: p, SessionId: sessionID, Prompt: msg.Content,
				IdempotencyKey: messageKey(msg), ConfigLatest: true})
			return err
		})
		if err != nil && closedMeanwhile(err) && reopens < maxReopens {
			// The alias's bound closed the session to make room
			// for another conversation since it was opened here.
			log.Info("channel conversation closed before its turn; reopening it", zap.String("session_id", sessionID))
			continue
		}
		if err != nil {
			log.Warn("channel message: prompt failed", zap.String("session_id", sessionID), zap.Error(err))
			return unanswered()
		}
		break
	}
	log.Info("channel message handed to a session", zap.String("session_id", sessionID), zap.Stringer("outcome", resp.GetOutcome()),
		zap.Bool("replayed", resp.GetReplayed()))
	answer := strings.TrimSpace(resp.GetContent())
	if answer == "" {
		switch resp.GetOutcome() {
		case sessionv1.TurnOutcome_TURN_OUTCOME_FAILED:
			notify("This message got no answer: the agent's turn failed.")
		case sessionv1.TurnOutcome_TURN_OUTCOME_CANCELLED:
			if ctx.Err() != nil {
				// Cancelled because the stop ended the call.
				return unanswered()
			}
			notify("This message got no answer: the agent's turn was cancelled.")
		}
		return true
	}
	if to == "" {
		return true
	}
	// b.sends, not ctx: an answer the turn gave goes out though the
	// binding stops meanwhile.
	if err := b.ch.Send(b.sends, wasmhost.CallInfo{Principal: "channel:" + b.cfg.Alias}, wasmhost.SendMessage{Recipient: to, Content: answer, ThreadID: msg.ThreadID}); err != nil {
		if b.sends.Err() != nil && b.handover.Load() {
			// The stop's grace ended the send: the next binding
			// delivers the message again, and its key gets the
			// finished turn's answer (replayed), sent once.
			log.Info("channel reply cut by the binding's stop; the next binding sends it", zap.String("session_id", sessionID))
			return false
		}
		log.Warn("channel reply failed", zap.String("session_id", sessionID), zap.Error(err))
		return true
	}
	s.observe(abi.ObserverChannelSent, map[string]string{"channel": b.cfg.Alias, "plugin": b.cfg.Plugin, "session_id": sessionID})
	return true
}

// noAnswer is the notice for a message the session service refused.
const noAnswer = "This message could not be answered; the operator's log has the reason."

// cutShort is the notice for a message whose delivery its binding's stop
// cut.
const cutShort = "This message was not answered: the channel was reconfigured or stopped before the agent's answer; send it again."

// Retries of a channel message's hand-off (whenAvailable).
const (
	retryFirst = 200 * time.Millisecond
	retryMost  = 5 * time.Second
)

// whenAvailable runs call until it succeeds, fails for good, awayWait
// has passed since its first refusal, or ctx (the binding's) is done. It
// retries what
// passes: the session service (or the config service behind NewSession)
// away, restarting or unreachable, and a turn of another replica on the
// same conversation (replicas share a listen address). Each was a message
// logged and dropped that its sender had been answered 202 for; the
// delivery waiting here holds its conversation (and one of the channel's
// maxConversations), and once every one waits, the queue fills and
// senders get 503. A
// Prompt cut off by the session service's restart is sent again with its
// message's idempotency key: the restarted service resumes the turn its
// predecessor left, and runs no tool of it twice.
func whenAvailable(ctx context.Context, log *zap.Logger, call func() error) error {
	wait := retryFirst
	var giveUp time.Time
	for {
		err := call()
		if err == nil || !passing(err) {
			return err
		}
		if giveUp.IsZero() {
			giveUp = time.Now().Add(awayWait)
			log.Warn("channel message waits for the session service", zap.Error(err))
		} else if time.Now().After(giveUp) {
			return fmt.Errorf("gave up waiting after %v: %w", awayWait, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gave up waiting: %w", err)
		case <-t.C:
		}
		wait = min(2*wait, retryMost)
	}
}

// closedMeanwhile reports whether err is a Prompt's refusal of a session
// that ended (session.errSessionEnded): closed, it is reopened; killed,
// the NewSession that would reopen it fails for good.
func closedMeanwhile(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return false
	}
	reason, _ := rpcerr.Details(st)
	return reason == rpcerr.ReasonConflict
}

// passing reports whether err is a refusal that a later try may not get.
func passing(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unavailable:
		return true
	case codes.FailedPrecondition:
		reason, _ := rpcerr.Details(st)
		return reason == rpcerr.ReasonSessionBusy
	}
	return false
}

// ListChannels reports this replica's channel bindings.
func (s *Server) ListChannels(context.Context, *pluginv1.ListChannelsRequest) (*pluginv1.ListChannelsResponse, error) {
	resp := &pluginv1.ListChannelsResponse{}
	if l := s.channels.listed.Load(); l != nil {
		for _, b := range *l {
			state, reason := b.status()
			resp.Channels = append(resp.Channels, &pluginv1.Channel{Alias: b.cfg.Alias, Plugin: b.cfg.Plugin, Listen: b.addr,
				Agent: b.cfg.Agent, InstanceKey: b.key, State: state, Reason: reason})
		}
	}
	return resp, nil
}

// boundConns serves at most n connections of lis at once. The listener
// takes connections from anyone who reaches its address, before any token
// is checked, and a connection lives on with a request every idle minute:
// without a bound, a local account could hold the sandbox's descriptors
// (which its gRPC server and plugins share) and a goroutine with buffers
// per connection. One past the bound is answered 503 and closed at once
// rather than left in the kernel's queue, so the sender learns why.
func boundConns(lis net.Listener, n int) net.Listener {
	return &connBound{Listener: lis, slots: make(chan struct{}, n)}
}

type connBound struct {
	net.Listener
	slots chan struct{}
}

// connRefusal is what a connection past the bound reads.
var connRefusal = func() string {
	const body = "the channel has too many connections; retry later\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

func (l *connBound) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, free: sync.OnceFunc(func() { <-l.slots })}, nil
		default:
		}
		// A fresh socket's send buffer takes the few bytes at once; the
		// deadline keeps a stuck one from holding the accept loop.
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(c, connRefusal)
		_ = c.Close()
	}
}

// slotConn gives its slot back when closed (once, however often Close
// is called).
type slotConn struct {
	net.Conn
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.free()
	return err
}

// listenReusePort listens with SO_REUSEPORT where the platform has it, so
// that every sandbox replica binds the same configured address and the
// kernel spreads connections over them.
func listenReusePort(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: reusePort}
	return lc.Listen(ctx, "tcp", addr)
}
