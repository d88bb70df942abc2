package durablebridge

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// paneEvents renders a pane's events after cursor after, for a reader of
// epoch. A reader of another epoch, without an epoch, ahead of the cursor
// or behind what the pane keeps gets the pane's current view instead
// (reset). ok is false when there is no such pane.
func (l *Layout) paneEvents(id, epoch string, after int64, hasAfter bool, tr transport) (body []byte, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p := l.panes[id]
	if p == nil {
		return nil, false
	}
	if epoch != l.epoch || !hasAfter || after > p.cursor || after < p.floor {
		return l.renderView(p, tr), true
	}
	return l.renderEvents(p, after, tr), true
}

// renderEvents writes the events after after: at most maxEventsPerPage,
// within the response limit; the cursor is the last one written, or the
// pane's cursor when every event was.
//
// An item the reader has not seen (put after after) is written where it
// was first put, with its current text, and not again where it last grew:
// a reader adds an item it does not know at its view's end, so each item
// must come before the items put after it, as the pane (and one built
// again from the store) orders them. A reader that saw the item gets its
// growth where it happened, and replaces the item in place.
func (l *Layout) renderEvents(p *pane, after int64, tr transport) []byte {
	var evs bytes.Buffer
	cursor := p.cursor
	last := after
	n := 0
	budget := limitEvents - 256
	for _, e := range p.events[firstAfter(p.events, after):] {
		if e.dead {
			continue
		}
		if e.typ == evItem && e.item.ev == e && e.item.birth != nil && e.item.birth != e && e.item.birth.seq > after {
			continue // written at its birth, which this page or an earlier one of this reader's had
		}
		raw, err := json.Marshal(e.wire(tr))
		if err != nil {
			continue
		}
		if n == maxEventsPerPage || evs.Len()+len(raw)+1 > budget {
			cursor = last
			break
		}
		if n > 0 {
			evs.WriteByte(',')
		}
		evs.Write(raw)
		last = e.seq
		n++
	}
	var b bytes.Buffer
	b.Grow(evs.Len() + 128)
	b.WriteString(`{"epoch":`)
	writeString(&b, l.epoch)
	b.WriteString(`,"cursor":`)
	b.WriteString(strconv.FormatInt(cursor, 10))
	b.WriteString(`,"reset":false,"events":[`)
	b.Write(evs.Bytes())
	b.WriteString("]}")
	return b.Bytes()
}

// firstAfter is the index of the first event with seq > after.
func firstAfter(events []*event, after int64) int {
	lo, hi := 0, len(events)
	for lo < hi {
		m := (lo + hi) / 2
		if events[m].seq <= after {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// renderView writes the pane's current view: the newest items (at most
// maxViewItems, within the response limit), the open asks, the turn and
// the state, at the current cursor.
func (l *Layout) renderView(p *pane, tr transport) []byte {
	var b bytes.Buffer
	b.WriteString(`{"epoch":`)
	writeString(&b, l.epoch)
	b.WriteString(`,"cursor":`)
	b.WriteString(strconv.FormatInt(p.cursor, 10))
	b.WriteString(`,"reset":true,"state":`)
	writeString(&b, p.state())
	b.WriteString(`,"turn":`)
	turn, _ := json.Marshal(p.turn.wire())
	b.Write(turn)
	b.WriteString(`,"asks":`)
	asks, _ := json.Marshal(p.wireAsks(tr, false))
	b.Write(asks)
	b.WriteString(`,"items":[`)
	// Newest first until the budget is spent, then written oldest first.
	budget := limitEvents - b.Len() - 64
	var picked [][]byte
	for i := len(p.items) - 1; i >= 0 && len(picked) < maxViewItems; i-- {
		raw, err := json.Marshal(p.items[i].wire())
		if err != nil {
			continue
		}
		if budget-len(raw)-1 < 0 {
			break
		}
		budget -= len(raw) + 1
		picked = append(picked, raw)
	}
	for i := len(picked) - 1; i >= 0; i-- {
		b.Write(picked[i])
		if i > 0 {
			b.WriteByte(',')
		}
	}
	b.WriteString("]}")
	return b.Bytes()
}

func (it *item) wire() *wireItem {
	return &wireItem{ID: it.id, Kind: it.kind, Text: string(it.text), At: stamp(it.at)}
}

func (e *event) wire(tr transport) *wireEvent {
	w := &wireEvent{Seq: e.seq, Type: e.typ}
	switch e.typ {
	case evItem:
		w.Item = e.item.wire()
	case evAsk:
		a := e.ask.wire(tr, false)
		w.Ask = &a
	case evAskClosed:
		w.AskID, w.By, w.Outcome = e.askID, e.by, &wireOutcome{Option: e.outcome}
	case evTurn:
		w.Turn, _ = json.Marshal(e.turn.wire())
		w.State = e.state
	}
	return w
}

func writeString(b *bytes.Buffer, s string) {
	raw, _ := json.Marshal(s)
	b.Write(raw)
}
