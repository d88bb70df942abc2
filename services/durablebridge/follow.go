package durablebridge

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Bounds of the follower.
const (
	// updateQueue bounds the session updates waiting to be applied; past
	// it a session is marked for a full reload instead.
	updateQueue = 8192
	// maxMarked bounds the sessions marked for reload; past it every pane
	// is reloaded.
	maxMarked = 4096
	// listPage is the page size of the session listings.
	listPage = 500
)

// follower keeps the Layout in step with the sessions: it loads every
// open session at start, then applies each session update from the bus,
// and every ReconcileEvery compares the layout with the session service's
// list (sessions opened or closed without a turn publish nothing). One
// goroutine applies everything, in update order.
type follower struct {
	b       *Bridge
	updates chan bus.Update
	wake    chan struct{}

	mu     sync.Mutex
	marked map[string]bool
	all    bool

	// holed are panes whose updates had a hole while a turn ran (only
	// the follower's goroutine reads or writes it): read again at that
	// turn's end, when the transcript holds what the lost updates showed
	// (apply).
	holed map[string]bool

	// suspects are panes whose turn disagreed with the session service at
	// the last reconcile, with the update they had applied then: only a
	// disagreement that outlives a reconcile reloads a pane (a turn's end
	// may fall between reading the view's sequence and its turn).
	suspects map[string]int64

	// unread are panes whose rows a turn's end could not read (only the
	// follower's goroutine reads or writes it): a turn cut by a crash
	// ends as the session service starts again, before it serves. They
	// are read at the next reconcile, and its interruption notice shows
	// then; before, it showed only with the pane's next turn. At most
	// one entry a pane.
	unread map[string]bool
}

func newFollower(b *Bridge) *follower {
	return &follower{b: b, updates: make(chan bus.Update, updateQueue), wake: make(chan struct{}, 1),
		marked: map[string]bool{}, holed: map[string]bool{}, suspects: map[string]int64{}, unread: map[string]bool{}}
}

// push is the bus callback: it never blocks the subscription.
func (f *follower) push(u bus.Update) {
	if u.Type == busv1.UpdateType_UPDATE_TYPE_TURN_STARTED {
		// For gateways (which connection's prompt was admitted): the
		// turn's first update shows it here.
		return
	}
	select {
	case f.updates <- u:
	default:
		f.mark(u.SessionID)
	}
}

// mark asks for a full reload of a session's pane.
func (f *follower) mark(id string) {
	f.mu.Lock()
	if len(f.marked) < maxMarked {
		f.marked[id] = true
	} else {
		f.all = true
	}
	f.mu.Unlock()
	f.poke()
}

// poke wakes the follower to reload marked panes and start queued turns.
func (f *follower) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run loads every open session (retrying until the session service
// answers), marks the layout ready, then follows until ctx is done.
func (f *follower) run(ctx context.Context) {
	log := f.b.log
	for {
		err := f.load(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		log.Info("sessions not loaded yet, retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
	f.b.layout.SetReady()
	log.Info("durable layout ready", zap.String("epoch", f.b.layout.Epoch()), zap.Int("panes", f.b.layout.PaneCount()))
	f.drainQueues(ctx)
	f.follow(ctx)
}

// follow applies updates, reloads, reconciles and expires asks until ctx
// is done.
func (f *follower) follow(ctx context.Context) {
	tick := time.NewTicker(f.b.cfg.ReconcileEvery)
	defer tick.Stop()
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	recheck := true
	for {
		// Every pane's asks are walked only when they may have changed or
		// one may have expired: a streamed chunk changes none, and at
		// hundreds of panes the walk per chunk cost more than the chunk.
		if recheck {
			expiry.Stop()
			if next := f.b.layout.expire(time.Now()); !next.IsZero() {
				expiry.Reset(time.Until(next))
			}
		}
		recheck = true
		select {
		case <-ctx.Done():
			return
		case u := <-f.updates:
			recheck = !f.apply(ctx, u)
		case <-f.wake:
			f.reloadMarked(ctx)
			f.drainQueues(ctx)
		case <-tick.C:
			f.reconcile(ctx)
			f.readUnread(ctx)
			f.drainQueues(ctx)
		case <-expiry.C:
		}
	}
}

// call bounds one call to the session service.
func (f *follower) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.b.cfg.CallTimeout)
}

// openViews lists every open session.
func (f *follower) openViews(ctx context.Context, wait bool) ([]*sessionv1.SessionView, error) {
	var out []*sessionv1.SessionView
	token := ""
	for {
		c, cancel := f.call(ctx)
		resp, err := f.b.sessions.ListSessionViews(c, &sessionv1.ListSessionViewsRequest{Principal: operator(), PageSize: listPage, PageToken: token},
			grpc.WaitForReady(wait))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		out = append(out, resp.GetViews()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// load shows every open session with its open asks.
func (f *follower) load(ctx context.Context) error {
	views, err := f.openViews(ctx, true)
	if err != nil {
		return err
	}
	for _, v := range views {
		if err := f.loadPane(ctx, v, true); err != nil {
			return err
		}
	}
	return nil
}

// loadPane builds a session's pane from its view and transcript, and
// puts it in the layout: in place of the pane it had when replace is set,
// else only when it has none (another goroutine may have shown it
// meanwhile, and may have applied later updates to it).
func (f *follower) loadPane(ctx context.Context, v *sessionv1.SessionView, replace bool) error {
	s := v.GetSession()
	var p *pane
	for tries := 0; ; tries++ {
		c, cancel := f.call(ctx)
		tr, err := f.b.sessions.Transcript(c, &sessionv1.TranscriptRequest{Principal: operator(), SessionId: s.GetSessionId(), Limit: maxViewItems})
		cancel()
		if err != nil {
			return fmt.Errorf("read transcript of %s: %w", s.GetSessionId(), err)
		}
		hist, covered := f.turnEvents(ctx, s.GetSessionId(), turnsOf(tr.GetMessages()))
		rows, hist, covered, err := f.olderRows(ctx, s, tr.GetMessages(), hist, covered)
		if err != nil {
			return err
		}
		shown := hist.shown
		if running := v.GetTurnId(); running != "" && shown[running] != nil {
			// The running turn's events were read after the view: the
			// updates between them would be applied again, its text
			// said twice. A view read now covers every event read (the
			// session wrote what the turn streamed before answering);
			// one of another turn has the pane built again.
			c, cancel := f.call(ctx)
			resp, err := f.b.sessions.GetSessionView(c, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: s.GetSessionId()})
			cancel()
			if err != nil {
				return fmt.Errorf("read session %s: %w", s.GetSessionId(), err)
			}
			now := resp.GetView()
			if now.GetIncarnation() != v.GetIncarnation() || now.GetTurnId() != running {
				if tries < 2 {
					v = now
					continue
				}
				// Still changing: built from the first view, the turn's
				// updates after it may show some text twice.
				shown[running] = nil
			} else {
				v = now
			}
		}
		s = v.GetSession()
		p = newPane(s.GetSessionId(), s.GetAgentAlias(), s.GetCreatedAt().AsTime())
		p.incarnation = v.GetIncarnation()
		p.sessionTitle = s.GetTitle()
		p.lastSeq = v.GetUpdateSeq()
		if running := v.GetTurnId(); running != "" && shown[running] != nil && covered > 0 {
			// The turn streamed on between the events' write and the
			// view's read: the chunks after covered are not in the
			// events, and are applied from their updates (a rebuilt
			// pane's thoughts lacked them). Updates up to the view's
			// seq applied again show nothing twice: a tool call is
			// put again whole, a result once, an ask raised once.
			p.lastSeq = min(p.lastSeq, covered)
		}
		if len(rows) > 0 {
			p.transcriptNext = rows[0].GetIndex()
		}
		f.showHistory(p, rows, hist)
		p.transcriptNext = tr.GetTotal()
		if tr.GetTotal() > 0 && len(rows) > 0 && rows[0].GetIndex() > 0 {
			p.firstPrompt = f.firstPrompt(ctx, s.GetSessionId())
		}
		break
	}
	if v.GetTurnId() != "" {
		p.turn = &turnInfo{id: v.GetTurnId(), started: v.GetTurnStartedAt().AsTime()}
		// Rows this turn writes at its end (tool results, its reply) are
		// shown from its updates.
		p.liveTurn = v.GetTurnId()
	}
	for _, a := range v.GetApprovals() {
		p.addAsk(f.askOf(p.id, a))
	}
	if replace {
		f.b.layout.put(p)
	} else {
		f.b.layout.putNew(p)
	}
	return nil
}

// maxBuildPages bounds the transcript pages one build of a pane reads
// (olderRows): 16,000 rows at most.
const maxBuildPages = 8

// olderRows extends rows, the newest page of a session's transcript,
// with the pages before it while a pane built from them would keep every
// item they show: a followed pane keeps its newest maxViewItems items,
// and a turn that says a line before each tool call writes two rows for
// each item it shows (the line, the call's result; its lines are one
// reply item), so the newest maxViewItems rows left out turns its
// follower still showed. It reads at most maxBuildPages pages in all, and
// asks for the events of the turns of the rows it adds. Rows stay
// contiguous: a page cut short (the session's 4 MiB a page) is read on
// from where it stopped, and dropped when the pages run out first.
func (f *follower) olderRows(ctx context.Context, s *sessionv1.Session, rows []*sessionv1.TranscriptMessage, h history, covered int64) ([]*sessionv1.TranscriptMessage, history, int64, error) {
	asked := map[string]bool{}
	for _, id := range turnsOf(rows) {
		asked[id] = true
	}
	for pages := 1; pages < maxBuildPages && len(rows) > 0 && rows[0].GetIndex() > 0; {
		q := newPane(s.GetSessionId(), s.GetAgentAlias(), s.GetCreatedAt().AsTime())
		f.showHistory(q, rows, h)
		if q.itemsDropped > 0 || len(q.items) >= maxViewItems {
			break
		}
		first := rows[0].GetIndex()
		from := max(first-maxViewItems, 0)
		var older []*sessionv1.TranscriptMessage
		for next := from; next < first && pages < maxBuildPages; pages++ {
			c, cancel := f.call(ctx)
			tr, err := f.b.sessions.Transcript(c, &sessionv1.TranscriptRequest{Principal: operator(), SessionId: s.GetSessionId(), AfterIndex: ptr(next - 1), Limit: first - next})
			cancel()
			if err != nil {
				return nil, h, covered, fmt.Errorf("read transcript of %s: %w", s.GetSessionId(), err)
			}
			got := tr.GetMessages()
			if len(got) == 0 || got[0].GetIndex() != next {
				return rows, h, covered, nil // deleted rows, or another session: keep what was read
			}
			for _, m := range got {
				if m.GetIndex() >= first {
					break
				}
				older = append(older, m)
				next = m.GetIndex() + 1
			}
		}
		if len(older) == 0 || older[len(older)-1].GetIndex() != first-1 {
			break // the pages ran out inside the gap
		}
		var turns []string
		for _, id := range turnsOf(older) {
			if !asked[id] {
				asked[id] = true
				turns = append(turns, id)
			}
		}
		more, c := f.turnEvents(ctx, s.GetSessionId(), turns)
		maps.Copy(h.shown, more.shown)
		maps.Copy(h.trims, more.trims)
		covered = max(covered, c)
		rows = append(older, rows...)
	}
	return rows, h, covered, nil
}

// firstPrompt reads a session's first user message, for its title.
func (f *follower) firstPrompt(ctx context.Context, id string) string {
	c, cancel := f.call(ctx)
	defer cancel()
	tr, err := f.b.sessions.Transcript(c, &sessionv1.TranscriptRequest{Principal: operator(), SessionId: id, AfterIndex: ptr(int64(-1)), Limit: 8})
	if err != nil {
		return ""
	}
	return firstUser(tr.GetMessages())
}

func firstUser(ms []*sessionv1.TranscriptMessage) string {
	for _, m := range ms {
		if m.GetRole() == "user" {
			return m.GetContent()
		}
	}
	return ""
}

func ptr[T any](v T) *T { return &v }

// askOf builds the ask of a pending approval.
func (f *follower) askOf(paneID string, a *sessionv1.ApprovalView) *ask {
	k := &ask{
		id: askID(paneID, a.GetToolCallId()), requestID: a.GetRequestId(), toolCallID: a.GetToolCallId(),
		toolName: a.GetToolName(), turnID: a.GetTurnId(), args: json.RawMessage(a.GetArgumentsJson()),
		revision: 1, created: a.GetCreatedAt().AsTime(),
	}
	if a.GetExpiresAt() != nil {
		k.expires = a.GetExpiresAt().AsTime()
	}
	if !json.Valid(k.args) {
		k.args, _ = json.Marshal(a.GetArgumentsJson())
	}
	return k
}

// rowItemID is the item id of a transcript row.
func rowItemID(idx int64) string { return fmt.Sprintf("m%d", idx) }

// roleKind maps a transcript role to an item kind.
func roleKind(role string) string {
	switch role {
	case "user":
		return kindUser
	case "assistant":
		return kindReply
	case "tool":
		return kindTool
	}
	return kindNotice
}

// updateParams are the fields of a session update the bridge reads.
type updateParams struct {
	TurnID     string          `json:"turn_id"`
	Text       string          `json:"text"`
	ToolCallID string          `json:"tool_call_id"`
	Name       string          `json:"name"`
	RawInput   json.RawMessage `json:"raw_input"`
	RawOutput  string          `json:"raw_output"`
	// OutputBytes is the whole output's length (raw_output may be cut).
	OutputBytes int    `json:"output_bytes"`
	Status      string `json:"status"`
	Outcome     string `json:"outcome"`
	Content     string `json:"content"`
	Dropped     int64  `json:"dropped_messages"`
}

// apply applies one session update. It reports asksKept: the update was
// a streamed chunk of a pane already shown, in a turn already known, or
// one the pane's view already covered (skipped), so no ask was added,
// removed or given a new expiry.
func (f *follower) apply(ctx context.Context, u bus.Update) (asksKept bool) {
	id := u.SessionID
	var seen, incarnation int64 = -1, 0
	f.b.layout.read(id, func(p *pane) { seen, incarnation = p.lastSeq, p.incarnation })
	if seen >= 0 && u.Incarnation < incarnation {
		// A late update of a session deleted under the id the pane's
		// session took after it: not this pane's, whatever its seq (a
		// new session counts from the start again).
		return true
	}
	if u.Type == busv1.UpdateType_UPDATE_TYPE_SESSION_DELETED {
		f.b.layout.remove(id)
		delete(f.holed, id)
		if err := f.b.store.forgetPane(ctx, id); err != nil {
			f.b.log.Warn("forget deleted session", zap.String("session_id", id), zap.Error(err))
		}
		return false
	}
	if seen < 0 {
		// A session the layout does not show yet: its view covers this
		// update.
		f.discover(ctx, id)
		return false
	}
	if u.Incarnation > incarnation {
		// The pane shows a session deleted under the id whose deletion
		// did not come (dropped at the queue's bound): the session now
		// under it is another one, shown from its view once the follower
		// reloads marked panes: one read however many of its updates
		// come meanwhile, and another at its next update if that fails.
		f.mark(id)
		return false
	}
	if u.Seq <= seen {
		// Covered by the view the pane was loaded from: the updates
		// queued while a pane loads are many under streaming, and none
		// changes an ask.
		return true
	}
	if u.Seq > seen+1 && !u.Renumbered {
		// Updates between were lost on the bus (its connection dropped
		// and came back, or the server dropped this slow consumer's):
		// applied as if this one followed them, the pane lacked them
		// for good, a turn's tool calls among them (a followed turn's
		// tool rows are its updates'). The pane is read again from the
		// session service at the end of the turn they belonged to,
		// when the transcript holds all it wrote (turnEnded), or at
		// once if no turn runs; read now, mid-turn, it would drop what
		// the turn's updates have shown so far. A renumbered update
		// follows a restarted session service's stored bound: what it
		// skips was never published.
		f.b.log.Info("session updates lost on the bus, the pane will be read again", zap.String("session_id", id),
			zap.Int64("after_seq", seen), zap.Int64("got_seq", u.Seq))
		f.holed[id] = true
		defer func() {
			idle := false
			f.b.layout.read(id, func(p *pane) { idle = p.turn == nil })
			if idle && f.holed[id] {
				delete(f.holed, id)
				f.mark(id)
			}
		}()
	}
	f.b.layout.mutate(id, func(p *pane) bool { p.lastSeq = u.Seq; return false })
	var up updateParams
	if err := json.Unmarshal(u.JSON, &up); err != nil {
		f.b.log.Warn("undecodable session update", zap.String("session_id", id), zap.Error(err))
		return false
	}
	typ := u.Type
	turnKnown := true
	if up.TurnID != "" && typ != busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE {
		turnKnown = !f.noteTurn(ctx, id, up.TurnID)
	}
	now := madeAt(u)
	switch typ {
	case busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK:
		f.b.layout.mutate(id, func(p *pane) bool { p.putItem(up.TurnID+":reply", kindReply, up.Text, now, true); return false })
		return turnKnown
	case busv1.UpdateType_UPDATE_TYPE_AGENT_THOUGHT_CHUNK:
		f.b.layout.mutate(id, func(p *pane) bool { p.putItem(up.TurnID+":thinking", kindThinking, up.Text, now, true); return false })
		return turnKnown
	case busv1.UpdateType_UPDATE_TYPE_TOOL_CALL:
		f.b.layout.mutate(id, func(p *pane) bool {
			p.putItem(up.ToolCallID, kindTool, up.Name+" "+string(up.RawInput), now, false)
			return false
		})
	case busv1.UpdateType_UPDATE_TYPE_TOOL_RESULT:
		f.b.layout.mutate(id, func(p *pane) bool {
			// Cut as the session kept it: a pane built again from what
			// it stored shows the same 16 KiB, where one that followed
			// showed 32 (the item's bound) of the update's 1 MiB.
			p.putToolResult(up.ToolCallID, up.Name, up.Status, tooloutput.KeptOf(up.RawOutput, up.OutputBytes), now)
			return false
		})
		f.resolveCall(ctx, id, up.ToolCallID)
	case busv1.UpdateType_UPDATE_TYPE_APPROVAL_REQUEST:
		f.raise(ctx, id)
	case busv1.UpdateType_UPDATE_TYPE_HISTORY_TRIMMED:
		f.b.layout.mutate(id, func(p *pane) bool {
			p.putTrimNotice(trimItemID(up.TurnID, u.Seq), up.Dropped, now)
			return false
		})
	case busv1.UpdateType_UPDATE_TYPE_TURN_COMPLETE:
		f.turnEnded(ctx, id, up)
	}
	return false
}

// discover shows a session the layout does not have yet.
func (f *follower) discover(ctx context.Context, id string) {
	c, cancel := f.call(ctx)
	resp, err := f.b.sessions.GetSessionView(c, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: id})
	cancel()
	if err != nil {
		if status.Code(err) != codes.NotFound {
			f.b.log.Warn("read new session", zap.String("session_id", id), zap.Error(err))
			f.mark(id)
		}
		return
	}
	if !open(resp.GetView().GetSession()) {
		return
	}
	if err := f.loadPane(ctx, resp.GetView(), false); err != nil {
		f.b.log.Warn("show new session", zap.String("session_id", id), zap.Error(err))
		f.mark(id)
	}
}

// open reports whether a session shows as a pane.
func open(s *sessionv1.Session) bool {
	st := s.GetState()
	return st == sessionv1.SessionState_SESSION_STATE_IDLE || st == sessionv1.SessionState_SESSION_STATE_RUNNING
}

// noteTurn starts following a turn the pane did not know: its start time
// from the session's view, and the transcript rows written before it ran
// (its prompt). It reports whether it did (false: the turn was known).
func (f *follower) noteTurn(ctx context.Context, id, turnID string) (read bool) {
	known := false
	f.b.layout.read(id, func(p *pane) { known = p.turn != nil && p.turn.id == turnID || p.liveTurn == turnID })
	if known {
		return false
	}
	started := time.Now()
	c, cancel := f.call(ctx)
	resp, err := f.b.sessions.GetSessionView(c, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: id})
	cancel()
	if err == nil && resp.GetView().GetTurnId() == turnID {
		started = resp.GetView().GetTurnStartedAt().AsTime()
	}
	// The turn may have written rows already (the text it said before a
	// tool call): its updates show them.
	f.showNewRows(ctx, id, func(p *pane, rows []*sessionv1.TranscriptMessage) { f.showRows(p, rows, turnID, false) })
	f.b.layout.mutate(id, func(p *pane) bool {
		p.turn = &turnInfo{id: turnID, started: started}
		p.liveTurn = turnID
		return true
	})
	return true
}

// showNewRows reads the transcript rows the pane has not shown, a page at
// a time, and hands each page to show under the layout's lock before it
// reads the next: gathered first, the rows a turn wrote could be tens of
// MiB held at once, where a page is at most the session service's 4 MiB.
//
// It reports false when a read failed: rows may be left.
func (f *follower) showNewRows(ctx context.Context, id string, show func(p *pane, rows []*sessionv1.TranscriptMessage)) bool {
	next := int64(-1)
	f.b.layout.read(id, func(p *pane) { next = p.transcriptNext })
	if next < 0 {
		return true // no pane
	}
	for {
		c, cancel := f.call(ctx)
		tr, err := f.b.sessions.Transcript(c, &sessionv1.TranscriptRequest{Principal: operator(), SessionId: id, AfterIndex: ptr(next - 1), Limit: maxViewItems})
		cancel()
		if err != nil {
			f.b.log.Warn("read transcript", zap.String("session_id", id), zap.Error(err))
			return false
		}
		ms := tr.GetMessages()
		if !f.b.layout.mutate(id, func(p *pane) bool { show(p, ms); return len(ms) > 0 }) {
			return true // the pane went meanwhile
		}
		// A page may end early, at the session service's byte bound: the
		// total says whether rows are left.
		if len(ms) == 0 || ms[len(ms)-1].GetIndex()+1 >= tr.GetTotal() {
			return true
		}
		next = ms[len(ms)-1].GetIndex() + 1
	}
}

// showRows shows transcript rows as items, but for the replies and tool
// rows of turn, a followed turn (none when empty): its updates showed
// them. With untagged, a row that names no turn (written by a session
// service from before rows named theirs) counts as turn's.
func (f *follower) showRows(p *pane, rows []*sessionv1.TranscriptMessage, turn string, untagged bool) {
	for _, m := range rows {
		if m.GetIndex() < p.transcriptNext {
			continue
		}
		p.transcriptNext = m.GetIndex() + 1
		role := m.GetRole()
		ofTurn := turn != "" && (m.GetTurnId() == turn || untagged && m.GetTurnId() == "") ||
			p.endedTurn != "" && m.GetTurnId() == p.endedTurn
		if ofTurn && (role == "tool" || role == "assistant") {
			continue
		}
		if role == "user" && p.firstPrompt == "" {
			p.firstPrompt = m.GetContent()
		}
		p.putItem(rowItemID(m.GetIndex()), roleKind(role), m.GetContent(), m.GetCreatedAt().AsTime(), false)
	}
}

// turnEnded closes what the turn left open and shows its end.
func (f *follower) turnEnded(ctx context.Context, id string, up updateParams) {
	var left []*ask
	f.b.layout.read(id, func(p *pane) {
		for _, a := range p.asks {
			if a.turnID == up.TurnID {
				left = append(left, a)
			}
		}
	})
	for _, a := range left {
		f.resolve(ctx, id, a)
	}
	if f.holed[id] {
		// Updates of this turn were lost (apply): the transcript and the
		// turn's events now hold what they showed. Read again here,
		// before the pane says the turn ended: marked for the next
		// wake-up instead, the pane showed the turn idle with its hole
		// until then, and a reader that took that view kept it.
		delete(f.holed, id)
		f.reload(ctx, id)
		ended := true
		f.b.layout.read(id, func(p *pane) { ended = p.liveTurn != up.TurnID && (p.turn == nil || p.turn.id != up.TurnID) })
		if ended {
			f.poke() // a text may wait for this pane's next turn
			return
		}
		// The reload failed, or its view still ran the turn: ended
		// below, and read again at the next wake-up.
		f.mark(id)
	}
	// The reply first, then the rows the turn wrote that its updates did
	// not show (those of a turn the pane did not follow live), then its
	// end.
	live := false
	f.b.layout.mutate(id, func(p *pane) bool {
		live = p.liveTurn == up.TurnID
		if live && up.Content != "" {
			p.putItem(up.TurnID+":reply", kindReply, up.Content, time.Now(), false)
			return true
		}
		return false
	})
	followed := ""
	if live {
		followed = up.TurnID
	}
	// A turn cut by a crash ends as the session service starts again
	// (recovery publishes before it serves): its rows are read at the
	// next reconcile (readUnread).
	if !f.showNewRows(ctx, id, func(p *pane, rows []*sessionv1.TranscriptMessage) { f.showRows(p, rows, followed, true) }) {
		f.unread[id] = true
	}
	f.b.layout.mutate(id, func(p *pane) bool {
		if p.turn != nil && p.turn.id == up.TurnID {
			p.turn = nil
		}
		if live {
			p.liveTurn, p.endedTurn = "", up.TurnID
		}
		return true
	})
	f.poke() // a text may wait for this pane's next turn
}

// readUnread reads the rows a turn's end could not. The replies and tool
// rows of the turn the pane followed last are its updates' (endedTurn).
func (f *follower) readUnread(ctx context.Context) {
	for id := range f.unread {
		if f.showNewRows(ctx, id, func(p *pane, rows []*sessionv1.TranscriptMessage) { f.showRows(p, rows, "", false) }) {
			delete(f.unread, id)
		}
	}
}

// raise opens the asks of the session's pending approvals.
func (f *follower) raise(ctx context.Context, id string) {
	c, cancel := f.call(ctx)
	resp, err := f.b.sessions.GetSessionView(c, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: id})
	cancel()
	if err != nil {
		f.b.log.Warn("read approval requests", zap.String("session_id", id), zap.Error(err))
		f.mark(id)
		return
	}
	for _, a := range resp.GetView().GetApprovals() {
		k := f.askOf(id, a)
		f.b.layout.mutate(id, func(p *pane) bool { return p.addAsk(k) })
	}
}

// resolveCall closes the ask of a tool call once its result is out.
func (f *follower) resolveCall(ctx context.Context, id, toolCallID string) {
	var a *ask
	f.b.layout.read(id, func(p *pane) { a = p.findAsk(askID(id, toolCallID)) })
	if a != nil {
		f.resolve(ctx, id, a)
	}
}

// resolve reads how an ask's approval ended and closes the ask; a still
// pending approval stays open.
func (f *follower) resolve(ctx context.Context, paneID string, a *ask) {
	c, cancel := f.call(ctx)
	resp, err := f.b.sessions.GetApproval(c, &sessionv1.GetApprovalRequest{Principal: operator(), SessionId: paneID, RequestId: a.requestID})
	cancel()
	var d decided
	switch {
	case status.Code(err) == codes.NotFound:
		d = decided{by: byProgram, outcome: optReject}
	case err != nil:
		f.b.log.Warn("read approval outcome", zap.String("session_id", paneID), zap.String("request_id", a.requestID), zap.Error(err))
		return
	default:
		var ok bool
		if d, ok = outcomeOf(resp.GetApproval()); !ok {
			return
		}
	}
	f.b.closeAsk(ctx, paneID, a.id, d)
}

// outcomeOf maps an approval's end to an ask's: who closed it and the
// option it amounts to. ok is false while it is pending.
func outcomeOf(a *sessionv1.ApprovalView) (decided, bool) {
	switch a.GetStatus() {
	case sessionv1.ApprovalStatus_APPROVAL_STATUS_PENDING:
		return decided{}, false
	case sessionv1.ApprovalStatus_APPROVAL_STATUS_TIMED_OUT:
		return decided{by: byTimeout, outcome: optReject}, true
	case sessionv1.ApprovalStatus_APPROVAL_STATUS_DECIDED:
		by := byProgram
		if a.GetSurface() == sessionv1.Surface_SURFACE_DURABLE {
			by = byPhone
		}
		opt := optReject
		switch a.GetDecision() {
		case sessionv1.Decision_DECISION_ALLOW_ONCE:
			opt = optAllowOnce
		case sessionv1.Decision_DECISION_ALLOW_ALWAYS:
			opt = optAllowAlways
		}
		return decided{by: by, outcome: opt}, true
	}
	// Cancelled: the turn stopped first, which the seed counts as decided
	// in the agent.
	return decided{by: byProgram, outcome: optReject}, true
}

// reloadMarked reloads the panes marked when updates were dropped.
func (f *follower) reloadMarked(ctx context.Context) {
	f.mu.Lock()
	marked, all := f.marked, f.all
	f.marked, f.all = map[string]bool{}, false
	f.mu.Unlock()
	if all {
		for _, id := range f.b.layout.paneIDs("") {
			marked[id] = true
		}
	}
	for id := range marked {
		f.reload(ctx, id)
	}
}

// reload rebuilds one pane from the session service: asks that are gone
// are closed with their outcome, readers take the new view.
func (f *follower) reload(ctx context.Context, id string) {
	c, cancel := f.call(ctx)
	resp, err := f.b.sessions.GetSessionView(c, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: id})
	cancel()
	if status.Code(err) == codes.NotFound || (err == nil && !open(resp.GetView().GetSession())) {
		f.b.layout.remove(id)
		delete(f.holed, id)
		return
	}
	if err != nil {
		f.b.log.Warn("reload pane", zap.String("session_id", id), zap.Error(err))
		return
	}
	pending := map[string]bool{}
	for _, a := range resp.GetView().GetApprovals() {
		pending[askID(id, a.GetToolCallId())] = true
	}
	var gone []*ask
	f.b.layout.read(id, func(p *pane) {
		for _, a := range p.asks {
			if !pending[a.id] {
				gone = append(gone, a)
			}
		}
	})
	for _, a := range gone {
		f.resolve(ctx, id, a)
	}
	if err := f.loadPane(ctx, resp.GetView(), true); err != nil {
		f.b.log.Warn("reload pane", zap.String("session_id", id), zap.Error(err))
		return
	}
	if resp.GetView().GetTurnId() == "" {
		// No turn runs: the transcript read holds all that updates
		// lost showed.
		delete(f.holed, id)
	}
}

// reconcile compares the layout with the open sessions: new ones are
// shown (unless the phone closed them after the list was read), closed
// ones removed, pending approvals raised, and a pane whose turn disagrees
// with a view read after every update it applied is reloaded.
func (f *follower) reconcile(ctx context.Context) {
	listed := time.Now()
	views, err := f.openViews(ctx, false)
	if err != nil {
		f.b.log.Debug("reconcile sessions", zap.Error(err))
		return
	}
	seen := make(map[string]bool, len(views))
	suspects := map[string]int64{}
	for _, v := range views {
		id := v.GetSession().GetSessionId()
		seen[id] = true
		var exists, replaced, stale bool
		var applied int64
		var missing []*sessionv1.ApprovalView
		var gone []*ask
		f.b.layout.read(id, func(p *pane) {
			exists, applied = true, p.lastSeq
			if replaced = p.incarnation != v.GetIncarnation(); replaced {
				return
			}
			turn := ""
			if p.turn != nil {
				turn = p.turn.id
			}
			// Behind the view (v's seq past the pane's) is stale too once
			// no update came between two looks (suspects, below): the
			// updates it lacks were lost on the bus, a turn's end among
			// them, and none may come to show it. Such a pane showed an
			// ended turn running, its reply cut, until the session's
			// next turn.
			stale = v.GetUpdateSeq() <= p.lastSeq && turn != v.GetTurnId() || p.sessionTitle != v.GetSession().GetTitle() ||
				v.GetUpdateSeq() > p.lastSeq
			if v.GetUpdateSeq() != p.lastSeq {
				// Only a view taken exactly where the pane stands says
				// which asks it lacks or holds too many of.
				return
			}
			pending := map[string]bool{}
			for _, a := range v.GetApprovals() {
				k := askID(id, a.GetToolCallId())
				pending[k] = true
				if p.findAsk(k) == nil {
					missing = append(missing, a)
				}
			}
			for _, a := range p.asks {
				if !pending[a.id] {
					gone = append(gone, a)
				}
			}
		})
		switch {
		case !exists:
			if f.b.closedSince(id, listed) {
				continue
			}
			if err := f.loadPane(ctx, v, false); err != nil {
				f.b.log.Warn("show session", zap.String("session_id", id), zap.Error(err))
			}
		case replaced:
			// The pane shows a session deleted under the id (its deletion
			// not applied yet, or lost): the one listed is another.
			f.reload(ctx, id)
		case stale:
			if last, ok := f.suspects[id]; ok && last == applied {
				f.b.log.Info("pane out of step with its session, reloading", zap.String("session_id", id))
				f.reload(ctx, id)
			} else {
				suspects[id] = applied
			}
		default:
			// A pending approval whose update was lost (or applied to a
			// pane replaced meanwhile) is raised now; an ask whose approval
			// is no longer pending is closed with its outcome.
			for _, a := range missing {
				k := f.askOf(id, a)
				f.b.layout.mutate(id, func(p *pane) bool { return p.addAsk(k) })
			}
			for _, a := range gone {
				f.resolve(ctx, id, a)
			}
		}
	}
	f.suspects = suspects
	// Panes shown after the list was read (a starter's, a reopened one)
	// are not in it and stay.
	for _, id := range f.b.layout.paneIDs("") {
		if !seen[id] {
			f.b.layout.removeIfBefore(id, listed)
		}
	}
	for id := range f.holed {
		if !f.b.layout.read(id, func(*pane) {}) {
			delete(f.holed, id) // closed: no turn of it to end
		}
	}
}

// drainQueues starts the next turn of each idle pane that has texts
// waiting.
func (f *follower) drainQueues(ctx context.Context) {
	if f.b.store == nil {
		return
	}
	qs, err := f.b.store.nextQueued(ctx)
	if err != nil {
		f.b.log.Warn("read queued texts", zap.Error(err))
		return
	}
	for _, q := range qs {
		idle := false
		if !f.b.layout.read(q.paneID, func(p *pane) { idle = p.turn == nil }) {
			// The pane is gone (closed): its texts go with it.
			if err := f.b.store.dequeue(ctx, q.seq); err != nil {
				f.b.log.Warn("drop queued text", zap.Error(err))
			}
			continue
		}
		if !idle {
			continue
		}
		c, cancel := f.call(ctx)
		_, err := f.b.sessions.StartTurn(c, &sessionv1.StartTurnRequest{Principal: operator(), SessionId: q.paneID, Prompt: q.text, Incarnation: q.incarnation})
		cancel()
		if isBusy(err) {
			continue
		}
		// NotFound and FailedPrecondition: the session is gone or ended;
		// InvalidArgument: the text can never run. Kept, either would
		// hold every later text of its pane behind it for ever.
		if code := status.Code(err); err != nil && code != codes.NotFound && code != codes.FailedPrecondition && code != codes.InvalidArgument {
			f.b.log.Warn("start queued turn", zap.String("session_id", q.paneID), zap.Error(err))
			continue
		}
		if err != nil {
			f.b.log.Info("queued text dropped: the session cannot run it", zap.String("session_id", q.paneID), zap.Error(err))
		}
		if err := f.b.store.dequeue(ctx, q.seq); err != nil {
			f.b.log.Warn("dequeue text", zap.Error(err))
		}
	}
}

// isBusy reports a SESSION_BUSY refusal: a turn is running.
func isBusy(err error) bool {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return false
	}
	reason, _ := rpcerr.Details(st)
	return reason == rpcerr.ReasonSessionBusy
}

// subscribe follows every session's updates into the follower.
func (f *follower) subscribe() (func(), error) {
	sub, err := bus.SubscribeAllSessionUpdates(f.b.cfg.NATS, f.push, func(err error) {
		f.b.log.Warn("session update dropped", zap.Error(err))
	})
	if err != nil {
		return nil, err
	}
	if err := f.b.cfg.NATS.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe session updates: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// madeAt is when an update's item happened: its publisher's clock where
// it said, which is what the session service stores with the event, so a
// pane rebuilt from the store shows the times one that followed showed.
// The bridge's own receipt lags by the bus and a loaded machine (over a
// second seen) and stands in only for a publisher that did not say, or
// one whose clock reads later than the bridge's.
func madeAt(u bus.Update) time.Time {
	now := time.Now()
	if u.MadeUnixMicros <= 0 {
		return now
	}
	if at := time.UnixMicro(u.MadeUnixMicros); at.Before(now) {
		return at
	}
	return now
}
