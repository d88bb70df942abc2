package durablebridge

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

type page struct {
	Epoch  string      `json:"epoch"`
	Cursor int64       `json:"cursor"`
	Reset  bool        `json:"reset"`
	Events []wireEvent `json:"events"`
	Items  []wireItem  `json:"items"`
	State  string      `json:"state"`
}

func readPage(t *testing.T, l *Layout, id, epoch string, after int64, hasAfter bool) page {
	t.Helper()
	body, ok := l.paneEvents(id, epoch, after, hasAfter, overSocket)
	if !ok {
		t.Fatalf("no pane %s", id)
	}
	if len(body) > limitEvents {
		t.Fatalf("events response of %d bytes", len(body))
	}
	var p page
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("events body: %v", err)
	}
	return p
}

// Pane events follow a cursor within an epoch: an item that grows is one
// event carrying its full text; at most 1000 events a response; a reader
// of another epoch, without one, ahead of the cursor or behind what is
// kept gets the current view (the newest 2000 items).
func TestPaneEvents(t *testing.T) {
	l := NewLayout(testEpoch)
	p := newPane("p1", "default", time.Now())
	p.putItem("m0", kindUser, "hello", time.Now(), false)
	l.put(p)

	first := readPage(t, l, "p1", testEpoch, 0, true)
	if !first.Reset || len(first.Items) != 1 || first.Items[0].Text != "hello" || first.State != stateIdle {
		t.Fatalf("first read %+v", first)
	}
	for _, w := range strings.Fields("a reply that grows word by word") {
		l.mutate("p1", func(p *pane) bool { p.putItem("t1:reply", kindReply, w+" ", time.Now(), true); return false })
	}
	next := readPage(t, l, "p1", testEpoch, first.Cursor, true)
	if next.Reset || len(next.Events) != 1 || next.Events[0].Item.Text != "a reply that grows word by word " || next.Cursor <= first.Cursor {
		t.Fatalf("growth %+v", next)
	}
	if same := readPage(t, l, "p1", testEpoch, next.Cursor, true); same.Reset || len(same.Events) != 0 || same.Cursor != next.Cursor {
		t.Fatalf("nothing new %+v", same)
	}
	for _, r := range []struct {
		epoch    string
		after    int64
		hasAfter bool
	}{{"other", next.Cursor, true}, {"", next.Cursor, true}, {testEpoch, next.Cursor + 5, true}, {testEpoch, 0, false}} {
		if v := readPage(t, l, "p1", r.epoch, r.after, r.hasAfter); !v.Reset || v.Cursor != next.Cursor || len(v.Items) != 2 {
			t.Fatalf("reader %+v got %+v", r, v)
		}
	}

	// 2500 new items: three responses of at most 1000 events.
	for i := range 2500 {
		l.mutate("p1", func(p *pane) bool { p.putItem(fmt.Sprintf("n%d", i), kindNotice, "x", time.Now(), false); return false })
	}
	cursor, seen := next.Cursor, 0
	for {
		pg := readPage(t, l, "p1", testEpoch, cursor, true)
		if pg.Reset || len(pg.Events) > maxEventsPerPage {
			t.Fatalf("page of %d events, reset %v", len(pg.Events), pg.Reset)
		}
		if len(pg.Events) == 0 {
			break
		}
		if pg.Events[0].Seq <= cursor || pg.Cursor != pg.Events[len(pg.Events)-1].Seq {
			t.Fatalf("cursor %d, events %d..%d", pg.Cursor, pg.Events[0].Seq, pg.Events[len(pg.Events)-1].Seq)
		}
		seen += len(pg.Events)
		cursor = pg.Cursor
	}
	if seen != 2500 {
		t.Fatalf("%d events read", seen)
	}
	// Past what is kept: the current view, newest 2000 items.
	// (The log keeps maxKeptEvents: ten more leave this reader behind.)
	for i := range maxKeptEvents + 10 {
		l.mutate("p1", func(p *pane) bool { p.putItem(fmt.Sprintf("k%d", i), kindNotice, "y", time.Now(), false); return false })
	}
	v := readPage(t, l, "p1", testEpoch, cursor, true)
	if !v.Reset || len(v.Items) != maxViewItems || v.Items[len(v.Items)-1].ID != fmt.Sprintf("k%d", maxKeptEvents+9) {
		t.Fatalf("lagging reader: reset %v, %d items", v.Reset, len(v.Items))
	}
}

// Item text is cut to its limit and cleaned of control and invisible
// characters; a pane's view stays within the events response limit.
func TestItemText(t *testing.T) {
	l := NewLayout(testEpoch)
	p := newPane("p1", "default", time.Now())
	p.putItem("a", kindReply, "ok\x00\x1b[31m\u200bred\u202e\tline\n", time.Now(), false)
	p.putItem("b", kindReply, strings.Repeat("é", maxChatText), time.Now(), false)
	p.putItem("c", kindTool, strings.Repeat("t", maxChatText), time.Now(), false)
	l.put(p)
	v := readPage(t, l, "p1", testEpoch, 0, false)
	if v.Items[0].Text != "ok[31mred\tline\n" {
		t.Fatalf("cleaned %q", v.Items[0].Text)
	}
	if len(v.Items[1].Text) != maxChatText || len(v.Items[2].Text) != maxCodeText {
		t.Fatalf("cut to %d and %d bytes", len(v.Items[1].Text), len(v.Items[2].Text))
	}
	for i := range 300 {
		l.mutate("p1", func(p *pane) bool {
			p.putItem(fmt.Sprintf("big%d", i), kindReply, strings.Repeat("<", maxChatText), time.Now(), false)
			return false
		})
	}
	readPage(t, l, "p1", testEpoch, 0, false) // fails past the limit
	readPage(t, l, "p1", testEpoch, 1, true)
}

// An item gone from the view kept its text in the event log until the
// log moved 4,096 events past it: 4,000 tool items of 32 KiB held 125 MiB
// in one pane whose view held 7.75 MiB, and the bridge follows every open
// session. The text of gone items' events is bounded as the view's is;
// past it the oldest events go, and a reader behind them gets the view.
func TestPaneLogHoldsNoMoreThanItsView(t *testing.T) {
	l := NewLayout(testEpoch)
	p := newPane("p1", "default", time.Now())
	p.putItem("m0", kindUser, "hello", time.Now(), false)
	l.put(p)
	first := readPage(t, l, "p1", testEpoch, 0, true)
	text := strings.Repeat("a", maxCodeText)
	held := func() int {
		n := 0
		for _, e := range p.events {
			if !e.dead && e.typ == evItem {
				n += len(e.item.text)
			}
		}
		return n
	}
	for i := range 4000 {
		l.mutate("p1", func(p *pane) bool {
			p.putItem(fmt.Sprintf("tc-%d", i), kindTool, text, time.Now(), false)
			return false
		})
		if n := held(); n > 2*maxPaneItemBytes {
			t.Fatalf("after %d items the log holds %d bytes of text; the view's bound is %d", i+1, n, maxPaneItemBytes)
		}
	}
	if p.itemBytes > maxPaneItemBytes || p.orphanBytes > maxPaneItemBytes || p.orphanBytes < 0 {
		t.Fatalf("view %d bytes, gone items %d", p.itemBytes, p.orphanBytes)
	}
	if v := readPage(t, l, "p1", testEpoch, first.Cursor, true); !v.Reset || v.Items[len(v.Items)-1].ID != "tc-3999" {
		t.Fatalf("a reader behind the log: reset %v, %d items", v.Reset, len(v.Items))
	}
	// A reader at the floor reads on, every event after it.
	cursor, seen := p.floor, 0
	for {
		pg := readPage(t, l, "p1", testEpoch, cursor, true)
		if pg.Reset {
			t.Fatalf("a reader at the floor was reset")
		}
		if len(pg.Events) == 0 {
			break
		}
		seen += len(pg.Events)
		cursor = pg.Cursor
	}
	if want := len(p.events) - p.dead; seen != want || cursor != p.cursor {
		t.Fatalf("read %d events to %d; the log has %d to %d", seen, cursor, want, p.cursor)
	}
}

// orphanBytes counts the text of gone items whose events are in the log:
// an item whose event the log had already dropped (pushed out by 4,096
// newer events while the item stayed in view) added its text when it left
// the view, which no drop ever took back, and past the bound every later
// trim emptied the whole log.
func TestPaneGoneItemsCountedOnlyInTheLog(t *testing.T) {
	l := NewLayout(testEpoch)
	p := newPane("p1", "default", time.Now())
	l.put(p)
	big := strings.Repeat("b", maxCodeText)
	put := func(id, kind, text string) {
		l.mutate("p1", func(p *pane) bool { p.putItem(id, kind, text, time.Now(), false); return false })
	}
	for i := range 200 {
		put(fmt.Sprintf("early-%d", i), kindTool, big)
	}
	for i := range maxKeptEvents + 10 { // the early items' events leave the log
		l.mutate("p1", func(p *pane) bool { p.addAsk(testAsk("p1", fmt.Sprintf("tc_%d", i))); return false })
	}
	for i := range maxViewItems + 60 { // and then the items leave the view
		kind, text := kindNotice, "n"
		if i >= maxViewItems {
			kind, text = kindTool, big
		}
		put(fmt.Sprintf("late-%d", i), kind, text)
	}
	held := 0
	for _, e := range p.events {
		if !e.dead && e.typ == evItem && e.item.gone {
			held += len(e.item.text)
		}
	}
	if p.orphanBytes != held {
		t.Fatalf("orphanBytes %d, the log's gone items hold %d", p.orphanBytes, held)
	}
	if v := readPage(t, l, "p1", testEpoch, p.cursor-5, true); v.Reset || len(v.Events) != 5 {
		t.Fatalf("a reader five events behind: reset %v, %d events", v.Reset, len(v.Events))
	}
}

// A pane removed and shown again in the same epoch (closed, then
// reopened, by the phone or by another client) started its cursor at 1
// again: a reader that still held the first pane's cursor, once the new
// pane's events passed it, was answered with the events after it, as if
// it had read the ones before, and never saw the turn, the items and the
// ask that came first. A pane shown again starts above every cursor an
// earlier one gave out, so that reader gets the current view.
func TestPaneShownAgainStartsAboveItsOldCursors(t *testing.T) {
	l := NewLayout(testEpoch)
	show := func() {
		p := newPane("p1", "default", time.Now())
		p.putItem("m0", kindUser, "hello", time.Now(), false)
		l.putNew(p)
	}
	show()
	old := readPage(t, l, "p1", testEpoch, 0, true)
	for i := range 5 {
		l.mutate("p1", func(p *pane) bool {
			p.putItem(fmt.Sprintf("a%d", i), kindNotice, "first", time.Now(), false)
			return false
		})
	}
	old = readPage(t, l, "p1", testEpoch, old.Cursor, true)
	if old.Reset || len(old.Events) != 5 {
		t.Fatalf("the first pane's events %+v", old)
	}
	l.remove("p1")
	show()
	// The new pane's first turn: an ask opens, items come, more than the
	// old reader's cursor counts.
	l.mutate("p1", func(p *pane) bool { p.addAsk(testAsk("p1", "tc_9")); return true })
	for i := range 10 {
		l.mutate("p1", func(p *pane) bool {
			p.putItem(fmt.Sprintf("b%d", i), kindNotice, "second", time.Now(), false)
			return false
		})
	}
	got := readPage(t, l, "p1", testEpoch, old.Cursor, true)
	if !got.Reset || got.State != stateWaiting || len(got.Items) != 11 {
		t.Fatalf("a reader of the first pane, after it was shown again: reset %v, state %q, %d items, %d events",
			got.Reset, got.State, len(got.Items), len(got.Events))
	}
	if v := readPage(t, l, "p1", testEpoch, got.Cursor, true); v.Reset || len(v.Events) != 0 {
		t.Fatalf("the view's cursor does not lead on: %+v", v)
	}
}

// reader is a Collie's view of a pane, built from its events as Collie
// builds it: an item it knows is replaced in place, one it does not is
// added at the end; a reset takes the view whole.
type reader struct {
	cursor int64
	items  []wireItem
	seqs   []int64
}

// catchUp reads pages until the reader is at the pane's cursor.
func (r *reader) catchUp(t *testing.T, l *Layout, id string) {
	t.Helper()
	for range 100 {
		pg := readPage(t, l, id, testEpoch, r.cursor, true)
		if pg.Reset {
			r.items = append([]wireItem(nil), pg.Items...)
		}
		for _, e := range pg.Events {
			if len(r.seqs) > 0 && e.Seq <= r.seqs[len(r.seqs)-1] || e.Seq <= r.cursor {
				t.Fatalf("event %d after %d, read from %d", e.Seq, r.seqs[len(r.seqs)-1], r.cursor)
			}
			r.seqs = append(r.seqs, e.Seq)
			if e.Type != evItem {
				continue
			}
			i := slices.IndexFunc(r.items, func(it wireItem) bool { return it.ID == e.Item.ID })
			if i < 0 {
				r.items = append(r.items, *e.Item)
			} else {
				r.items[i] = *e.Item
			}
		}
		r.seqs = r.seqs[:0]
		done := pg.Cursor == r.cursor || pg.Reset
		r.cursor = pg.Cursor
		if done || len(pg.Events) == 0 {
			return
		}
	}
	t.Fatal("a reader did not catch up in 100 pages")
}

// Items that grow after later items were put (a turn's reply after its
// tool call, its thinking after its reply) came to a reader that had not
// seen them after those later items, where they had last grown: the
// e2e's followed pane showed a turn's tool call before its reply, the
// pane built from the store the reply first. Readers that start all
// through the turns (a phone coming back with its last cursor) and read
// at every step or only at the end, across pages of 1000 events and the
// log's compaction, now all end with the pane's own order, each item
// once, and every page's seqs in order.
func TestPaneEventsKeepTheItemsOrderForEveryCursor(t *testing.T) {
	l := NewLayout(testEpoch)
	p := newPane("p1", "default", time.Now())
	p.putItem("m0", kindUser, "hello", time.Now(), false)
	l.put(p)
	put := func(id, kind, text string, grow bool) {
		l.mutate("p1", func(p *pane) bool { p.putItem(id, kind, text, time.Now(), grow); return false })
	}
	var late, eager []*reader
	step := func() {
		// Each starts with the view of the moment (a reset).
		r := &reader{}
		r.catchUp(t, l, "p1")
		late = append(late, r)
		r = &reader{}
		r.catchUp(t, l, "p1")
		eager = append(eager, r)
		for _, e := range eager {
			e.catchUp(t, l, "p1")
		}
	}
	for turn := range 6 {
		tid := fmt.Sprintf("T%d", turn)
		put(fmt.Sprintf("m%d", turn+1), kindUser, "prompt", false)
		step()
		put(tid+":thinking", kindThinking, "weighing ", true)
		step()
		put(tid+":reply", kindReply, "first ", true)
		step()
		put(tid+"-call", kindTool, "echo {}", false)
		step()
		l.mutate("p1", func(p *pane) bool { p.putToolResult(tid+"-call", "echo", "completed", "{}", time.Now()); return false })
		for i := range 400 {
			put(tid+":reply", kindReply, "w ", true)
			if i%97 == 0 {
				put(tid+":thinking", kindThinking, "again ", true)
				step()
			}
		}
		put(trimItemID(tid, 0), kindNotice, "trimmed", false)
		put(tid+":reply", kindReply, "whole reply", false)
		step()
	}
	want := readPage(t, l, "p1", "", 0, false).Items
	if len(want) != 6*5+1 {
		t.Fatalf("the pane's view has %d items", len(want))
	}
	for i, r := range append(late, eager...) {
		r.catchUp(t, l, "p1")
		if !slices.Equal(r.items, want) {
			var got, w []string
			for _, it := range r.items {
				got = append(got, it.ID)
			}
			for _, it := range want {
				w = append(w, it.ID)
			}
			t.Fatalf("reader %d (of %d late, then eager):\n%v\nthe pane:\n%v", i, len(late), got, w)
		}
	}
}
