package durablebridge

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/pgtext"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// command is one parsed POST, ready to run once.
type command interface {
	run(ctx context.Context, b *Bridge, tr transport) (int, any)
}

type okReply struct {
	OK bool `json:"ok"`
}

// parsePost reads a POST body for route name (ids are the path's ids):
// a command, or nil and why the body does not fit the route.
func parsePost(name string, body map[string]any, ids []string) (command, string) {
	str := func(k string) (string, bool) { s, ok := body[k].(string); return s, ok }
	switch name {
	case "answer":
		askID, ok := str("askId")
		if !ok {
			return nil, "`askId` is required"
		}
		rev, err := intField(body, "revision")
		if err != nil {
			return nil, "`revision` must be a whole number"
		}
		// Revisions start at 1: a lower one was never an ask's, so it is
		// not an older revision (409 stale) but a body that does not fit.
		if rev < 1 {
			return nil, "`revision` starts at 1"
		}
		ans, ok := body["answer"].(map[string]any)
		if !ok {
			return nil, "`answer` must be an object"
		}
		opt, ok := ans["option"].(string)
		if !ok {
			// Clawmesh raises permission asks only, answered with an option.
			return nil, "a permission ask is answered with {\"option\": ...}"
		}
		return &answerCmd{pane: ids[0], ask: askID, revision: rev, option: opt}, ""
	case "send":
		text, ok := str("text")
		if !ok || strings.TrimSpace(text) == "" {
			return nil, "`text` must be a non-empty string"
		}
		// As the session service will store it: queued here first, a NUL
		// (JSON's \u0000) failed the insert, answered 503 at every retry.
		text = cutText(pgtext.Text(text), maxPhoneText)
		// Checked again as it is sent: blank in its first 32 KiB, it was
		// queued, refused by the session service as no prompt at every
		// drain, and held back every text queued behind it.
		if strings.TrimSpace(text) == "" {
			return nil, "`text` is blank in its first 32 KiB, which is all that is sent"
		}
		turn, _ := str("turn")
		if v, present := body["turn"]; present && v != nil && turn == "" {
			return nil, "`turn` must be a turn id or null"
		}
		return &sendCmd{pane: ids[0], text: text, turn: turn}, ""
	case "abort":
		turn, ok := str("turn")
		if !ok {
			return nil, "`turn` must name the running turn"
		}
		return &abortCmd{pane: ids[0], turn: turn}, ""
	case "action":
		action, ok := str("action")
		if !ok {
			return nil, "`action` is required"
		}
		return &actionCmd{pane: ids[0], action: action}, ""
	case "rename":
		kind, id, msg := target(body, "workspace", "tab")
		if msg != "" {
			return nil, msg
		}
		title, ok := str("title")
		if title = cleanLine(title, maxTitle); !ok || title == "" {
			return nil, "`title` must be a non-empty string"
		}
		return &renameCmd{kind: kind, id: id, title: title}, ""
	case "close":
		kind, id, msg := target(body, "pane", "tab", "workspace")
		if msg != "" {
			return nil, msg
		}
		return &closeCmd{kind: kind, id: id}, ""
	case "starter":
		text, _ := str("text")
		if v, present := body["text"]; present && v != nil {
			if _, ok := v.(string); !ok {
				return nil, "`text` must be a string"
			}
		}
		return &starterCmd{starter: ids[0], text: cutText(pgtext.Text(text), maxPhoneText)}, ""
	case "reopen":
		conv, ok := str("conversation")
		if !ok {
			return nil, "`conversation` is required"
		}
		return &reopenCmd{conversation: conv}, ""
	}
	return nil, "unknown route"
}

// target reads {"target": {<kind>: id}} with exactly one of kinds.
func target(body map[string]any, kinds ...string) (kind, id, msg string) {
	t, ok := body["target"].(map[string]any)
	if !ok {
		return "", "", "`target` must be an object naming one of " + strings.Join(kinds, ", ")
	}
	for _, k := range kinds {
		if v, ok := t[k].(string); ok {
			if kind != "" {
				return "", "", "`target` must name exactly one of " + strings.Join(kinds, ", ")
			}
			kind, id = k, v
		}
	}
	if kind == "" {
		return "", "", "`target` must name one of " + strings.Join(kinds, ", ")
	}
	return kind, id, ""
}

func intField(body map[string]any, k string) (int64, error) {
	n, ok := body[k].(json.Number)
	if !ok {
		return 0, strconv.ErrSyntax
	}
	return n.Int64()
}

// cutText cuts the phone's text at limit bytes on a character boundary.
func cutText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

func wireFail(code, msg string) wireError { return wireError{Code: code, Message: msg} }

// unavailable is the answer when the session service could not be asked:
// a 5xx is not remembered, so the phone may send the id again.
func (b *Bridge) unavailable(op string, err error) (int, any) {
	b.log.Warn("session service call failed", zap.String("op", op), zap.Error(err))
	return http.StatusServiceUnavailable, wireFail(codeUnavailable, "the session service did not answer")
}

// storeUnavailable is unavailable for the bridge's own database: the
// session service was not at fault, and the phone is not told it was.
func (b *Bridge) storeUnavailable(op string, err error) (int, any) {
	b.log.Warn("durable store call failed", zap.String("op", op), zap.Error(err))
	return http.StatusServiceUnavailable, wireFail(codeUnavailable, "the bridge's database did not answer")
}

// answerCmd answers an ask.
type answerCmd struct {
	pane, ask string
	revision  int64
	option    string
}

type answerReply struct {
	OK      bool         `json:"ok"`
	Outcome *wireOutcome `json:"outcome,omitempty"`
	Code    string       `json:"code,omitempty"`
}

type decidedReply struct {
	Code    string      `json:"code"`
	By      string      `json:"by"`
	Outcome wireOutcome `json:"outcome"`
}

// decisions maps an option to the session service's decision.
var decisions = map[string]sessionv1.Decision{
	optAllowOnce:   sessionv1.Decision_DECISION_ALLOW_ONCE,
	optAllowAlways: sessionv1.Decision_DECISION_ALLOW_ALWAYS,
	optReject:      sessionv1.Decision_DECISION_REJECT,
}

func (c *answerCmd) run(ctx context.Context, b *Bridge, tr transport) (int, any) {
	var a *ask
	if !b.layout.read(c.pane, func(p *pane) {
		if k := p.findAsk(c.ask); k != nil {
			cp := *k
			a = &cp
		}
	}) {
		return http.StatusNotFound, wireFail(codeNoSuchPane, "")
	}
	if a == nil {
		d, err := b.store.decidedAsk(ctx, c.pane, c.ask)
		if err == nil {
			return http.StatusConflict, decidedReply{Code: codeDecided, By: d.by, Outcome: wireOutcome{Option: d.outcome}}
		}
		if err != errNoRow {
			return b.storeUnavailable("read decided ask", err)
		}
		return http.StatusOK, answerReply{OK: false, Code: codeTooLate}
	}
	if c.revision != a.revision {
		return http.StatusConflict, wireFail(codeStale, "this ask changed; read it again")
	}
	if !offered(tr, c.option) {
		return http.StatusBadRequest, wireFail(codeBadRequest, "`option` is not one of this ask's options")
	}
	resp, err := b.sessions.Approve(ctx, &sessionv1.ApproveRequest{
		Principal: operator(), SessionId: c.pane, RequestId: a.requestID,
		Decision: decisions[c.option], Surface: sessionv1.Surface_SURFACE_DURABLE,
	})
	switch {
	case status.Code(err) == codes.NotFound:
		// The session service no longer knows the request (its session
		// went, or it restarted): the question may show again.
		return http.StatusOK, answerReply{OK: false, Code: codeTooLate}
	case err != nil:
		return b.unavailable("approve", err)
	case resp.GetAcknowledged():
		d := decided{by: byPhone, outcome: c.option}
		b.closeAsk(ctx, c.pane, a.id, d)
		return http.StatusOK, answerReply{OK: true, Outcome: &wireOutcome{Option: c.option}}
	}
	// Someone decided first: say who, and how. The answer says which
	// decision stands; a session service from before it did is asked.
	stands := &sessionv1.ApprovalView{Status: resp.GetStatus(), Decision: resp.GetDecision(), Surface: resp.GetSurface()}
	if stands.Status == sessionv1.ApprovalStatus_APPROVAL_STATUS_UNSPECIFIED {
		ga, err := b.sessions.GetApproval(ctx, &sessionv1.GetApprovalRequest{Principal: operator(), SessionId: c.pane, RequestId: a.requestID})
		if err != nil {
			return b.unavailable("read approval", err)
		}
		stands = ga.GetApproval()
	}
	d, ok := outcomeOf(stands)
	if !ok {
		return http.StatusOK, answerReply{OK: false, Code: codeTooLate}
	}
	b.closeAsk(ctx, c.pane, a.id, d)
	return http.StatusConflict, decidedReply{Code: codeDecided, By: d.by, Outcome: wireOutcome{Option: d.outcome}}
}

// closeAsk records how an ask ended and closes it on its pane.
func (b *Bridge) closeAsk(ctx context.Context, paneID, id string, d decided) {
	// Recorded even when the phone left (the store bounds the call).
	if err := b.store.recordDecided(context.WithoutCancel(ctx), paneID, id, d); err != nil {
		b.log.Warn("record decided ask", zap.String("session_id", paneID), zap.Error(err))
	}
	b.layout.mutate(paneID, func(p *pane) bool { return p.closeAsk(id, d.by, d.outcome) })
}

// sendCmd prompts a pane: a new turn when it is idle, the next turn when
// one runs.
type sendCmd struct {
	pane, text, turn string
}

type sendReply struct {
	OK     bool `json:"ok"`
	Queued bool `json:"queued"`
}

func (c *sendCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	// The text is for the session the pane shows: a session made under
	// its id since is another (StartTurn refuses it as not found).
	var incarnation int64
	if !b.layout.read(c.pane, func(p *pane) { incarnation = p.incarnation }) {
		return http.StatusNotFound, wireFail(codeNoSuchPane, "")
	}
	if c.turn == "" {
		_, err := b.sessions.StartTurn(ctx, &sessionv1.StartTurnRequest{Principal: operator(), SessionId: c.pane, Prompt: c.text, Incarnation: incarnation})
		switch {
		case err == nil:
			return http.StatusOK, sendReply{OK: true}
		case isBusy(err):
			return b.enqueue(ctx, c.pane, incarnation, c.text)
		}
		return b.sessionRefusal("start turn", err, codeNoSuchPane)
	}
	v, err := b.sessions.GetSessionView(ctx, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: c.pane})
	if err != nil {
		return b.sessionRefusal("read session", err, codeNoSuchPane)
	}
	if v.GetView().GetIncarnation() != incarnation {
		return http.StatusNotFound, wireFail(codeNoSuchPane, "")
	}
	if v.GetView().GetTurnId() != c.turn {
		return http.StatusConflict, wireFail(codeTurnChanged, "the turn named is not the running one")
	}
	// A running turn cannot take more input: the text starts the next.
	return b.enqueue(ctx, c.pane, incarnation, c.text)
}

func (b *Bridge) enqueue(ctx context.Context, paneID string, incarnation int64, text string) (int, any) {
	err := b.store.enqueue(ctx, paneID, incarnation, text)
	if err == errQueueFull {
		return http.StatusConflict, wireFail(codeQueueFull, err.Error())
	}
	if err != nil {
		return b.storeUnavailable("queue text", err)
	}
	b.follower.poke()
	return http.StatusOK, sendReply{OK: true, Queued: true}
}

// sessionRefusal maps a session service refusal to the wire.
func (b *Bridge) sessionRefusal(op string, err error, notFound string) (int, any) {
	switch status.Code(err) {
	case codes.NotFound:
		return http.StatusNotFound, wireFail(notFound, "")
	case codes.FailedPrecondition:
		// The session is closed or killed.
		return http.StatusNotFound, wireFail(notFound, status.Convert(err).Message())
	case codes.InvalidArgument:
		return http.StatusBadRequest, wireFail(codeBadRequest, status.Convert(err).Message())
	case codes.ResourceExhausted:
		// The service answered, at a bound (a principal's open sessions):
		// said as it is, and as a 5xx, which is not remembered, so the
		// same request id may be tried once there is room.
		return http.StatusServiceUnavailable, wireFail(codeUnavailable, status.Convert(err).Message())
	}
	return b.unavailable(op, err)
}

// abortCmd stops the running turn the phone saw.
type abortCmd struct {
	pane, turn string
}

func (c *abortCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	if !b.layout.has(c.pane) {
		return http.StatusNotFound, wireFail(codeNoSuchPane, "")
	}
	resp, err := b.sessions.CancelTurn(ctx, &sessionv1.CancelTurnRequest{Principal: operator(), SessionId: c.pane, TurnId: c.turn})
	if err != nil {
		return b.sessionRefusal("cancel turn", err, codeNoSuchPane)
	}
	if !resp.GetCancelled() {
		return http.StatusConflict, wireFail(codeTurnChanged, "the turn named is not the running one")
	}
	return http.StatusOK, okReply{OK: true}
}

// actionCmd is a tap on a pane's bar.
type actionCmd struct {
	pane, action string
}

func (c *actionCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	offeredNow := false
	if !b.layout.read(c.pane, func(p *pane) { offeredNow = p.hasAction(c.action) }) {
		return http.StatusNotFound, wireFail(codeNoSuchPane, "")
	}
	switch {
	case c.action == actionStop:
		// Offered while a turn runs; a turn that ended meanwhile leaves
		// nothing to stop, which is what the tap asked.
		if _, err := b.sessions.Cancel(ctx, &sessionv1.CancelRequest{Principal: operator(), SessionId: c.pane}); err != nil {
			return b.sessionRefusal("cancel", err, codeNoSuchPane)
		}
		return http.StatusOK, okReply{OK: true}
	case c.action == actionClose && offeredNow:
		return b.closePanes(ctx, []string{c.pane})
	}
	return http.StatusBadRequest, wireFail(codeBadRequest, "`action` is not one of this pane's actions")
}

// renameCmd retitles the workspace or a tab.
type renameCmd struct {
	kind, id, title string
}

func (c *renameCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	var key string
	switch c.kind {
	case "workspace":
		if c.id != workspaceID {
			return http.StatusNotFound, wireFail(codeNoSuchWorkspace, "")
		}
		key = workspaceKey()
	case "tab":
		alias, ok := b.layout.hasTab(c.id)
		if !ok {
			return http.StatusNotFound, wireFail(codeNoSuchTab, "")
		}
		key = tabKey(alias)
	}
	if err := b.store.setTitle(ctx, key, c.title); err != nil {
		return b.storeUnavailable("store title", err)
	}
	b.layout.setTitle(key, c.title)
	return http.StatusOK, okReply{OK: true}
}

// closeCmd closes a pane, every pane of a tab, or every pane.
type closeCmd struct {
	kind, id string
}

func (c *closeCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	switch c.kind {
	case "pane":
		if !b.layout.has(c.id) {
			return http.StatusNotFound, wireFail(codeNoSuchPane, "")
		}
		return b.closePanes(ctx, []string{c.id})
	case "tab":
		alias, ok := b.layout.hasTab(c.id)
		if !ok {
			return http.StatusNotFound, wireFail(codeNoSuchTab, "")
		}
		return b.closePanes(ctx, b.layout.paneIDs(alias))
	}
	if c.id != workspaceID {
		return http.StatusNotFound, wireFail(codeNoSuchWorkspace, "")
	}
	return b.closePanes(ctx, b.layout.paneIDs(""))
}

// closePanes closes sessions; their history stays (conversations, reopen).
func (b *Bridge) closePanes(ctx context.Context, ids []string) (int, any) {
	for _, id := range ids {
		b.noteClosed(id)
		_, err := b.sessions.Close(ctx, &sessionv1.CloseRequest{Principal: operator(), SessionId: id})
		if err != nil && status.Code(err) != codes.NotFound && status.Code(err) != codes.FailedPrecondition {
			return b.unavailable("close session", err)
		}
		b.layout.remove(id)
	}
	return http.StatusOK, okReply{OK: true}
}

// durableSurface is the interaction surface of the sessions the bridge
// opens (starters).
const durableSurface = "durable"

// starterCmd opens a session from a configured starter.
type starterCmd struct {
	starter, text string
}

type paneReply struct {
	OK   bool   `json:"ok"`
	Pane string `json:"pane"`
}

func (c *starterCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	s, ok := b.layout.starter(c.starter)
	if !ok {
		return http.StatusNotFound, wireFail(codeNoSuchStarter, "")
	}
	created, err := b.sessions.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: operator(), AgentAlias: s.Agent, InteractionSurface: durableSurface})
	if err != nil {
		return b.sessionRefusal("new session", err, codeNoSuchStarter)
	}
	id := created.GetSessionId()
	if err := b.show(ctx, id); err != nil {
		return b.unavailable("show session", err)
	}
	prompt := s.Prompt
	if c.text != "" {
		if prompt != "" {
			prompt += "\n\n"
		}
		prompt += c.text
	}
	if strings.TrimSpace(prompt) != "" {
		var incarnation int64
		b.layout.read(id, func(p *pane) { incarnation = p.incarnation })
		if _, err := b.sessions.StartTurn(ctx, &sessionv1.StartTurnRequest{Principal: operator(), SessionId: id, Prompt: prompt, Incarnation: incarnation}); err != nil {
			// The pane exists: say so, and why its first turn did not start.
			b.log.Warn("starter's first turn", zap.String("session_id", id), zap.Error(err))
		}
	}
	return http.StatusOK, paneReply{OK: true, Pane: id}
}

// show puts a session's pane in the layout now, rather than at the next
// reconcile.
func (b *Bridge) show(ctx context.Context, id string) error {
	v, err := b.sessions.GetSessionView(ctx, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: id})
	if err != nil {
		return err
	}
	if err := b.follower.loadPane(ctx, v.GetView(), false); err != nil {
		return err
	}
	// The pane may have brought asks: the follower's loop walks them for
	// expiry when woken, not on the chunks it streams meanwhile.
	b.follower.poke()
	return nil
}

// reopenCmd shows a closed conversation again.
type reopenCmd struct {
	conversation string
}

func (c *reopenCmd) run(ctx context.Context, b *Bridge, _ transport) (int, any) {
	v, err := b.sessions.GetSessionView(ctx, &sessionv1.GetSessionViewRequest{Principal: operator(), SessionId: c.conversation})
	if err != nil {
		return b.sessionRefusal("read conversation", err, codeNoSuchConv)
	}
	if v.GetView().GetSession().GetState() == sessionv1.SessionState_SESSION_STATE_KILLED {
		return http.StatusConflict, wireFail(codeConversationEnded, "this conversation was killed and cannot be reopened")
	}
	// The session service resumes a session from its own surface only: a
	// starter's conversation is the bridge's (durableSurface), the others
	// are its socket clients' (no surface named).
	surface := ""
	if v.GetView().GetSession().GetInteractionSurface() == durableSurface {
		surface = durableSurface
	}
	if _, err := b.sessions.NewSession(ctx, &sessionv1.NewSessionRequest{Principal: operator(), SessionId: c.conversation, InteractionSurface: surface}); err != nil {
		return b.sessionRefusal("reopen", err, codeNoSuchConv)
	}
	if err := b.show(ctx, c.conversation); err != nil {
		return b.unavailable("show session", err)
	}
	return http.StatusOK, paneReply{OK: true, Pane: c.conversation}
}

// conversations pages through every session, open and closed, newest
// first.
func (b *Bridge) conversations(ctx context.Context, q url.Values) (int, any) {
	limit, ok := pageSize(q.Get("limit"), 50, maxHistoryPage)
	if !ok {
		return http.StatusBadRequest, wireFail(codeBadRequest, "`limit` must be between 1 and 100")
	}
	after := q.Get("after")
	if q.Has("after") && !validCursor(after) {
		return http.StatusBadRequest, wireFail(codeBadRequest, "`after` is not a cursor")
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	resp, err := b.sessions.ListSessionViews(ctx, &sessionv1.ListSessionViewsRequest{Principal: operator(), IncludeClosed: true, PageSize: int64(limit), PageToken: after})
	if err != nil {
		return b.sessionRefusal("list conversations", err, codeNoSuchConv)
	}
	out := struct {
		Conversations []wireConversation `json:"conversations"`
		Next          *string            `json:"next"`
	}{Conversations: []wireConversation{}}
	for _, v := range resp.GetViews() {
		s := v.GetSession()
		c := wireConversation{ID: s.GetSessionId(), Open: open(s), UpdatedAt: stamp(s.GetUpdatedAt().AsTime())}
		title := ""
		b.layout.read(c.ID, func(p *pane) { title = p.title() })
		if title == "" {
			title = cleanLine(s.GetTitle(), maxTitle)
		}
		if title == "" {
			title = cleanLine(s.GetAgentAlias()+" session", maxTitle)
		}
		c.Title = title
		if c.Open {
			c.Pane = c.ID
		}
		out.Conversations = append(out.Conversations, c)
	}
	if next := resp.GetNextPageToken(); next != "" {
		out.Next = &next
	}
	return http.StatusOK, out
}

// items pages through a conversation's transcript, oldest first.
func (b *Bridge) items(ctx context.Context, id string, q url.Values) (int, any) {
	limit, ok := pageSize(q.Get("limit"), 100, maxItemsPage)
	if !ok {
		return http.StatusBadRequest, wireFail(codeBadRequest, "`limit` must be between 1 and 1000")
	}
	after := int64(-1)
	if q.Has("after") {
		n, err := strconv.ParseInt(q.Get("after"), 10, 64)
		if !validCursor(q.Get("after")) || err != nil || n < -1 {
			return http.StatusBadRequest, wireFail(codeBadRequest, "`after` is not a cursor")
		}
		after = n
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.CallTimeout)
	defer cancel()
	tr, err := b.sessions.Transcript(ctx, &sessionv1.TranscriptRequest{Principal: operator(), SessionId: id, AfterIndex: &after, Limit: int64(limit)})
	if err != nil {
		return b.sessionRefusal("read conversation", err, codeNoSuchConv)
	}
	out := struct {
		Items []*wireItem `json:"items"`
		Next  *string     `json:"next"`
	}{Items: []*wireItem{}}
	size, last := 0, after
	for _, m := range tr.GetMessages() {
		it := &item{id: rowItemID(m.GetIndex()), kind: roleKind(m.GetRole()), at: m.GetCreatedAt().AsTime()}
		limit := maxChatText
		if it.kind == kindTool {
			limit = maxCodeText
		}
		it.text = []byte(clean(m.GetContent(), limit))
		w := it.wire()
		size += len(mustJSON(w)) + 1
		if size > limitItems-256 {
			break
		}
		out.Items = append(out.Items, w)
		last = m.GetIndex()
	}
	if last+1 < tr.GetTotal() {
		next := strconv.FormatInt(last, 10)
		out.Next = &next
	}
	return http.StatusOK, out
}

// pageSize reads a limit: dflt when absent, else 1 to max.
func pageSize(s string, dflt, max int) (int, bool) {
	if s == "" {
		return dflt, true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > max {
		return 0, false
	}
	return n, true
}
