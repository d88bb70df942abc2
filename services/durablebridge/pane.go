package durablebridge

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// Bounds of what one pane keeps in memory.
const (
	// maxKeptEvents bounds a pane's event log (superseded events do not
	// count: an item's growth replaces its earlier event, but for its
	// first, which stays where the item was put: item.birth). A reader
	// further behind gets the pane's current view.
	maxKeptEvents = 4096
	// maxPaneItemBytes bounds the text of a pane's items: the newest ones
	// are kept, as many as an events response can carry. The text of
	// items gone from the view whose events a reader behind may still
	// read is bounded by it too (orphanBytes).
	maxPaneItemBytes = limitEvents - (256 << 10)
)

// pane is one session as the phone sees it. Its fields are guarded by the
// Layout's mu.
type pane struct {
	id, alias string
	// incarnation is the shown session's (SessionView.incarnation): the
	// id may be deleted and made again, and updates of another
	// incarnation are not this session's.
	incarnation  int64
	sessionTitle string
	firstPrompt  string
	created      time.Time
	// shownAt is when the pane was put in the layout.
	shownAt time.Time

	turn *turnInfo
	// asks are the open asks, oldest first.
	asks []*ask

	// items are the pane's current view, oldest first: at most
	// maxViewItems and maxPaneItemBytes of text.
	items     []*item
	itemByID  map[string]*item
	itemBytes int
	// itemsDropped counts the items trimItems dropped from the view: a
	// build that reads older rows stops at the first (olderRows).
	itemsDropped int

	// events holds every live event with seq > floor, in seq order;
	// superseded ones are marked dead and dropped on compaction. cursor is
	// the last seq given out.
	events []*event
	dead   int
	cursor int64
	floor  int64
	// orphanBytes is the text of items gone from the view whose events
	// are still live. Before it was bounded, 4,000 tool items of 32 KiB
	// held 125 MiB through the log where the view held 7.75.
	orphanBytes int

	// shown is the turn and state the last turn event announced.
	shownTurn  string
	shownState string

	// transcriptNext is the next transcript index not shown yet.
	transcriptNext int64
	// liveTurn is the turn whose reply and tool calls were shown from
	// updates: its transcript rows are already on screen.
	liveTurn string
	// endedTurn is the last turn followed live whose end came: its
	// replies and tool rows read after its end are its updates' too. A
	// turn cut by a crash ends while the session service starts again
	// (its recovery's turn_complete), and its rows, read at the next
	// turn's start, showed the reply twice.
	endedTurn string
	// lastSeq is the last session update applied.
	lastSeq int64
}

type turnInfo struct {
	id      string
	started time.Time
}

type item struct {
	id, kind string
	text     []byte
	limit    int
	at       time.Time
	// ev is the item's current event (nil before the pane's first view).
	ev *event
	// birth is the event that first put the item in the log, while the
	// log holds it: when the item grows its new event goes to the log's
	// end, and birth stays where it was, so that a reader that never saw
	// the item takes it there (renderEvents) and not after the items put
	// after it. Moved to the end, a reply that grew after its turn's tool
	// call came after the call for a reader that read both at once (one
	// late, or that polled between them), where the pane and a pane built
	// again from the store show the reply first.
	birth *event
	// gone is set once the item left the view (trimItems).
	gone bool
	// resulted is set on a tool item once its result is shown.
	resulted bool
}

// ask is one open approval request of a pane. It does not change once
// raised: a new revision would be a new ask value.
type ask struct {
	id         string
	requestID  string
	toolCallID string
	toolName   string
	turnID     string
	args       json.RawMessage
	revision   int64
	created    time.Time
	expires    time.Time
	// expired is set once expires passed: the ask is no longer listed as
	// open, and its closing (by the timeout, or whoever decided first)
	// comes from the session service.
	expired bool
}

type event struct {
	seq  int64
	typ  string
	dead bool

	item *item
	ask  *ask
	// ask-closed
	askID   string
	by      string
	outcome string
	// turn
	turn  *turnInfo
	state string
}

// Event types.
const (
	evItem      = "item"
	evAsk       = "ask"
	evAskClosed = "ask-closed"
	evTurn      = "turn"
)

// askID is an ask's id: the first 32 hex digits of the SHA-256 of the
// pane id, a NUL and the tool call id. The same call raised again after a
// restart gets the same id.
func askID(paneID, toolCallID string) string {
	h := sha256.Sum256([]byte(paneID + "\x00" + toolCallID))
	return hex.EncodeToString(h[:16])
}

func newPane(id, alias string, created time.Time) *pane {
	return &pane{id: id, alias: alias, created: created, itemByID: map[string]*item{}, shownState: stateIdle}
}

// state is idle, running, or waiting while an ask is open.
func (p *pane) state() string {
	if p.openAsks() > 0 {
		return stateWaiting
	}
	if p.turn != nil {
		return stateRunning
	}
	return stateIdle
}

func (p *pane) openAsks() int {
	n := 0
	for _, a := range p.asks {
		if !a.expired {
			n++
		}
	}
	return n
}

func (p *pane) title() string {
	if t := cleanLine(p.sessionTitle, maxTitle); t != "" {
		return t
	}
	first, _, _ := strings.Cut(p.firstPrompt, "\n")
	if t := cleanLine(first, maxTitle); t != "" {
		return t
	}
	return "New session"
}

// append gives e the next seq and logs it.
func (p *pane) append(e *event) {
	p.cursor++
	e.seq = p.cursor
	p.events = append(p.events, e)
	if len(p.events)-p.dead > maxKeptEvents {
		p.trim()
	}
	if p.dead > 64 && p.dead > len(p.events)/2 {
		p.compact()
	}
}

// trim drops the oldest events beyond the bound; readers behind them get
// the current view.
func (p *pane) trim() {
	drop := len(p.events) - p.dead - maxKeptEvents
	i := 0
	for ; i < len(p.events) && drop > 0; i++ {
		if !p.events[i].dead {
			drop--
		}
	}
	p.dropFront(i)
}

// dropFront drops the first n events, and raises the floor past them.
func (p *pane) dropFront(n int) {
	for _, e := range p.events[:n] {
		switch {
		case e.dead:
			p.dead--
		case e.typ == evItem:
			if e.item.birth == e {
				e.item.birth = nil
			}
			if e.item.ev != e {
				break // its birth: the item's text is its live event's
			}
			if e.item.gone {
				p.orphanBytes -= len(e.item.text)
			}
			// Its item has no event in the log now: trimmed from the view
			// later, it adds nothing to orphanBytes, and put again it
			// supersedes nothing.
			e.item.ev = nil
		}
		p.floor = e.seq
	}
	p.events = slices.Delete(p.events, 0, n)
}

func (p *pane) compact() {
	live := p.events[:0]
	for _, e := range p.events {
		if !e.dead {
			live = append(live, e)
		}
	}
	clear(p.events[len(live):])
	p.events = live
	p.dead = 0
}

// putItem adds an item, or changes the one with the same id: its text is
// replaced, or extended when grow is set. The item's earlier event is
// superseded by a new one carrying the full current text.
func (p *pane) putItem(id, kind, text string, at time.Time, grow bool) {
	it := p.itemByID[id]
	created := it == nil
	if created {
		limit := maxChatText
		if kind == kindTool {
			limit = maxCodeText
		}
		it = &item{id: id, kind: kind, limit: limit, at: at}
		p.itemByID[id] = it
		p.items = append(p.items, it)
	} else if it.ev != nil && it.ev != it.birth {
		it.ev.dead = true
		p.dead++
	}
	old := len(it.text)
	if grow {
		it.text = appendClean(it.text, text, it.limit)
	} else {
		it.text = appendClean(it.text[:0], text, it.limit)
	}
	p.itemBytes += len(it.text) - old
	e := &event{typ: evItem, item: it}
	it.ev = e
	if created {
		it.birth = e
	}
	p.append(e)
	p.trimItems()
}

// appendClean appends text to b, cleaned, up to limit bytes in all.
func appendClean(b []byte, text string, limit int) []byte {
	if len(b) >= limit {
		return b
	}
	return append(b, clean(text, limit-len(b))...)
}

// trimItems forgets the oldest items beyond the pane's bounds. Their
// events stay until the log moves past them, or until their text passes
// maxPaneItemBytes: then the oldest events go, and a reader behind them
// gets the current view.
func (p *pane) trimItems() {
	n := 0
	for len(p.items)-n > maxViewItems || (p.itemBytes > maxPaneItemBytes && len(p.items)-n > 1) {
		it := p.items[n]
		p.itemBytes -= len(it.text)
		delete(p.itemByID, it.id)
		it.gone = true
		if it.ev != nil && !it.ev.dead {
			p.orphanBytes += len(it.text)
		}
		n++
	}
	if n == 0 {
		return
	}
	p.itemsDropped += n
	p.items = slices.Delete(p.items, 0, n)
	i := 0
	for over := p.orphanBytes - maxPaneItemBytes; over > 0 && i < len(p.events); i++ {
		if e := p.events[i]; !e.dead && e.typ == evItem && e.item.gone && e.item.ev == e {
			over -= len(e.item.text)
		}
	}
	if i > 0 {
		p.dropFront(i)
	}
}

// addAsk opens a; it reports false when an ask with its id is open.
func (p *pane) addAsk(a *ask) bool {
	for _, o := range p.asks {
		if o.id == a.id {
			return false
		}
	}
	p.asks = append(p.asks, a)
	slices.SortStableFunc(p.asks, func(x, y *ask) int { return x.created.Compare(y.created) })
	p.append(&event{typ: evAsk, ask: a})
	return true
}

// findAsk returns the open ask with id, or nil.
func (p *pane) findAsk(id string) *ask {
	for _, a := range p.asks {
		if a.id == id {
			return a
		}
	}
	return nil
}

// closeAsk closes an open ask; it reports false when it was not open.
func (p *pane) closeAsk(id, by, outcome string) bool {
	for i, a := range p.asks {
		if a.id == id {
			p.asks = slices.Delete(p.asks, i, i+1)
			p.append(&event{typ: evAskClosed, askID: id, by: by, outcome: outcome})
			return true
		}
	}
	return false
}

// announce logs a turn event when the turn or the state changed since the
// last one; it reports whether it did.
func (p *pane) announce() bool {
	turnID := ""
	if p.turn != nil {
		turnID = p.turn.id
	}
	st := p.state()
	if turnID == p.shownTurn && st == p.shownState {
		return false
	}
	p.shownTurn, p.shownState = turnID, st
	var t *turnInfo
	if p.turn != nil {
		cp := *p.turn
		t = &cp
	}
	p.append(&event{typ: evTurn, turn: t, state: st})
	return true
}

// actions are the buttons of the pane's bar.
func (p *pane) actions() []wireAction {
	if p.turn != nil {
		return []wireAction{{ID: actionStop, Label: "Stop"}, {ID: actionClose, Label: "Close"}}
	}
	return []wireAction{{ID: actionClose, Label: "Close"}}
}

// Pane actions.
const (
	actionStop  = "stop"
	actionClose = "close"
)

func (p *pane) hasAction(id string) bool {
	for _, a := range p.actions() {
		if a.ID == id {
			return true
		}
	}
	return false
}
