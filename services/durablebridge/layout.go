package durablebridge

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clawmesh/clawmesh/internal/configclient"
)

// transport is who asks: the private socket or the token transport. The
// bytes differ in one thing only: no allow_always behind the token.
type transport int

const (
	overSocket transport = iota
	overToken
	transports
)

// workspaceID is the one workspace: the data directory (SPEC §9).
const workspaceID = "ws-main"

// tabPrefix makes a tab id of an agent alias.
const tabPrefix = "tab-"

// Layout is what the phone sees: the panes (sessions), grouped in tabs
// (agent aliases) in one workspace (the data directory), their asks and
// events, the starters, and the snapshot's revision. Its methods are safe
// for concurrent use.
type Layout struct {
	epoch string
	ready atomic.Bool

	mu    sync.RWMutex
	rev   int64
	panes map[string]*pane
	// retired is the highest cursor of a pane removed in this epoch: a
	// pane shown again under its id starts above it, so a reader still
	// holding the old pane's cursor takes the new pane's view instead of
	// its events from the middle.
	retired  int64
	titles   map[string]string
	starters []configclient.DurableStarter

	// etag is the current `"<epoch>-<rev>"`, readable without mu so a 304
	// costs almost nothing.
	etag atomic.Pointer[string]

	cacheMu sync.Mutex
	cache   [transports]cachedSnapshot
}

type cachedSnapshot struct {
	rev  int64
	etag string
	body []byte
}

// NewLayout builds an empty layout for epoch; it is not ready.
func NewLayout(epoch string) *Layout {
	l := &Layout{epoch: epoch, panes: map[string]*pane{}, titles: map[string]string{}}
	l.bump()
	return l
}

// Epoch is the layout's epoch.
func (l *Layout) Epoch() string { return l.epoch }

// Ready reports whether every conversation is shown and every open ask
// raised again.
func (l *Layout) Ready() bool { return l.ready.Load() }

// SetReady marks the layout ready.
func (l *Layout) SetReady() {
	l.mu.Lock()
	l.ready.Store(true)
	l.bump()
	l.mu.Unlock()
}

// bump raises the revision; mu is held (or the layout is not shared yet).
func (l *Layout) bump() {
	l.rev++
	tag := `"` + l.epoch + "-" + strconv.FormatInt(l.rev, 10) + `"`
	l.etag.Store(&tag)
}

// ETag is the snapshot's current entity tag.
func (l *Layout) ETag() string { return *l.etag.Load() }

// Rev is the snapshot's current revision.
func (l *Layout) Rev() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.rev
}

// PaneCount is how many panes the layout holds.
func (l *Layout) PaneCount() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.panes)
}

// mutate runs fn on pane id under the lock; fn reports whether it changed
// something a snapshot shows. A change of the pane's turn or state is
// announced as a turn event. It reports false when there is no such pane.
func (l *Layout) mutate(id string, fn func(p *pane) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.panes[id]
	if p == nil {
		return false
	}
	visible := fn(p)
	if p.announce() || visible {
		l.bump()
	}
	return true
}

// has reports whether the pane exists.
func (l *Layout) has(id string) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.panes[id] != nil
}

// read runs fn on pane id under the read lock.
func (l *Layout) read(id string, fn func(p *pane)) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p := l.panes[id]
	if p == nil {
		return false
	}
	fn(p)
	return true
}

// put adds a pane, or replaces the pane with its id: the events logged
// so far no longer lead to its content, so every reader of it takes its
// current view.
func (l *Layout) put(np *pane) { l.install(np, true) }

func (l *Layout) install(np *pane, replace bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A reader's first read (after 0) takes the view, as does a reader of
	// a pane removed before (retired).
	base := l.retired + 1
	if old := l.panes[np.id]; old != nil {
		if !replace {
			return
		}
		base = old.cursor + 1
	}
	clear(np.events)
	np.events, np.dead, np.orphanBytes = np.events[:0], 0, 0
	for _, it := range np.items {
		it.ev, it.birth = nil, nil
	}
	np.cursor, np.floor = base, base
	np.shownAt = time.Now()
	np.shownState = np.state()
	np.shownTurn = ""
	if np.turn != nil {
		np.shownTurn = np.turn.id
	}
	l.panes[np.id] = np
	l.bump()
}

// putNew adds a pane unless the layout has one with its id.
func (l *Layout) putNew(np *pane) { l.install(np, false) }

// removeIfBefore drops a pane shown before t.
func (l *Layout) removeIfBefore(id string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.panes[id]; p != nil && p.shownAt.Before(t) {
		l.retire(p)
		l.bump()
	}
}

// remove drops a pane; it reports whether there was one.
func (l *Layout) remove(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.panes[id]
	if p == nil {
		return false
	}
	l.retire(p)
	l.bump()
	return true
}

// retire drops a pane and keeps its cursor in retired; mu is held.
func (l *Layout) retire(p *pane) {
	delete(l.panes, p.id)
	l.retired = max(l.retired, p.cursor)
}

// paneIDs lists the panes, all of them or those of one alias.
func (l *Layout) paneIDs(alias string) []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []string
	for id, p := range l.panes {
		if alias == "" || p.alias == alias {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// hasTab reports whether a tab with that id is shown.
func (l *Layout) hasTab(tabID string) (alias string, ok bool) {
	alias, ok = strings.CutPrefix(tabID, tabPrefix)
	if !ok {
		return "", false
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, p := range l.panes {
		if p.alias == alias {
			return alias, true
		}
	}
	return "", false
}

// setTitle sets a workspace's or tab's title.
func (l *Layout) setTitle(key, title string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.titles[key] == title {
		return
	}
	l.titles[key] = title
	l.bump()
}

// setTitles installs the stored titles.
func (l *Layout) setTitles(titles map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.titles = titles
	l.bump()
}

// setStarters installs the configured starters.
func (l *Layout) setStarters(s []configclient.DurableStarter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if slices.Equal(l.starters, s) {
		return
	}
	l.starters = slices.Clone(s)
	l.bump()
}

// starter returns the configured starter with that id.
func (l *Layout) starter(id string) (configclient.DurableStarter, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, s := range l.starters {
		if s.ID == id {
			return s, true
		}
	}
	return configclient.DurableStarter{}, false
}

// expire marks the asks whose expiry passed; it returns the next expiry
// ahead (zero when none).
func (l *Layout) expire(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var next time.Time
	changed := false
	for _, p := range l.panes {
		hit := false
		for _, a := range p.asks {
			switch {
			case a.expired || a.expires.IsZero():
			case !a.expires.After(now):
				a.expired, hit = true, true
			case next.IsZero() || a.expires.Before(next):
				next = a.expires
			}
		}
		if hit {
			p.announce()
			changed = true
		}
	}
	if changed {
		l.bump()
	}
	return next
}

// titleOf is a workspace's or tab's title.
func (l *Layout) titleOf(key, dflt string) string {
	if t := l.titles[key]; t != "" {
		return t
	}
	return dflt
}

func workspaceKey() string          { return "workspace:" + workspaceID }
func tabKey(alias string) string    { return "tab:" + alias }
func tabID(alias string) string     { return tabPrefix + alias }
func defaultWorkspaceTitle() string { return "clawmesh" }

// Snapshot returns the snapshot body for tr and its ETag; bodies are
// built once per revision.
func (l *Layout) Snapshot(tr transport) (etag string, body []byte) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	l.cacheMu.Lock()
	defer l.cacheMu.Unlock()
	c := &l.cache[tr]
	if c.body != nil && c.rev == l.rev {
		return c.etag, c.body
	}
	c.rev, c.etag, c.body = l.rev, *l.etag.Load(), l.renderSnapshot(tr)
	return c.etag, c.body
}

// renderSnapshot builds the snapshot within its size limit: asks are
// shown lean, then the oldest panes left out, when it would not fit.
func (l *Layout) renderSnapshot(tr transport) []byte {
	panes := make([]*pane, 0, len(l.panes))
	for _, p := range l.panes {
		panes = append(panes, p)
	}
	// Newest first, so the limit leaves out the oldest.
	slices.SortFunc(panes, func(a, b *pane) int {
		if c := b.created.Compare(a.created); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	if len(panes) > maxPanes {
		panes = panes[:maxPanes]
	}
	lean := false
	for {
		body, err := json.Marshal(l.snapshotDoc(tr, panes, lean))
		if err == nil && len(body) <= limitSnapshot {
			return body
		}
		if !lean {
			lean = true
			continue
		}
		panes = panes[:len(panes)/2]
	}
}

func (l *Layout) snapshotDoc(tr transport, panes []*pane, lean bool) wireSnapshot {
	byAlias := map[string][]wirePane{}
	var aliases []string
	for _, p := range panes {
		if _, ok := byAlias[p.alias]; !ok {
			aliases = append(aliases, p.alias)
		}
		byAlias[p.alias] = append(byAlias[p.alias], l.renderPane(p, tr, lean))
	}
	slices.Sort(aliases)
	if len(aliases) > maxTabs {
		aliases = aliases[:maxTabs]
	}
	ws := wireWorkspace{ID: workspaceID, Title: l.titleOf(workspaceKey(), defaultWorkspaceTitle()), Tabs: []wireTab{}}
	for _, a := range aliases {
		ws.Tabs = append(ws.Tabs, wireTab{ID: tabID(a), Title: l.titleOf(tabKey(a), cleanLine(a, maxTitle)), Panes: byAlias[a]})
	}
	doc := wireSnapshot{Epoch: l.epoch, Rev: l.rev, Workspaces: []wireWorkspace{ws}, Starters: []wireStarter{}}
	for i, s := range l.starters {
		if i == maxStarters {
			break
		}
		title := cleanLine(s.Title, maxTitle)
		if title == "" {
			title = s.ID
		}
		doc.Starters = append(doc.Starters, wireStarter{ID: s.ID, Title: title, Description: cleanLine(s.Description, maxLine)})
	}
	return doc
}

func (l *Layout) renderPane(p *pane, tr transport, lean bool) wirePane {
	wp := wirePane{ID: p.id, Title: p.title(), State: p.state(), Turn: p.turn.wire(), Asks: p.wireAsks(tr, lean), Actions: p.actions()}
	return wp
}

func (t *turnInfo) wire() *wireTurn {
	if t == nil {
		return nil
	}
	return &wireTurn{ID: t.id, StartedAt: stamp(t.started)}
}

// wireAsks lists the open asks, oldest first, at most the limit.
func (p *pane) wireAsks(tr transport, lean bool) []wireAsk {
	out := []wireAsk{}
	for _, a := range p.asks {
		if a.expired {
			continue
		}
		if len(out) == maxAsksPerPane {
			break
		}
		out = append(out, a.wire(tr, lean))
	}
	return out
}

// wire renders a permission ask. Its title and body come from the tool's
// name and arguments only, never from the model's words.
func (a *ask) wire(tr transport, lean bool) wireAsk {
	name := cleanLine(a.toolName, maxTitle)
	w := wireAsk{
		ID: a.id, Kind: "permission", Revision: a.revision,
		Title:   clean("Run tool `"+name+"`", maxAskTitle),
		Body:    argumentsText(a.args, lean),
		Options: options(tr),
	}
	w.Tool = &wireTool{Name: name}
	if !lean && len(a.args) <= maxToolArgs && json.Valid(a.args) {
		w.Tool.Arguments = a.args
	}
	if !a.expires.IsZero() {
		w.ExpiresAt = stamp(a.expires)
	}
	return w
}

// options are a permission ask's choices: allow_always only on the
// private socket, where the token is not the only barrier.
func options(tr transport) []wireOption {
	if tr == overToken {
		return []wireOption{{ID: optAllowOnce, Label: "Allow once"}, {ID: optReject, Label: "Reject"}}
	}
	return []wireOption{{ID: optAllowOnce, Label: "Allow once"}, {ID: optAllowAlways, Label: "Allow always"}, {ID: optReject, Label: "Reject"}}
}

func offered(tr transport, option string) bool {
	for _, o := range options(tr) {
		if o.ID == option {
			return true
		}
	}
	return false
}

// argumentsText shows a call's arguments: one "name: value" line per
// field of an object, in name order, else the JSON itself.
func argumentsText(args json.RawMessage, lean bool) string {
	limit := maxAskBody
	if lean {
		limit = 256
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(args, &obj) != nil || len(obj) == 0 {
		return clean(string(args), limit)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		if b.Len() >= limit {
			break
		}
		v := obj[k]
		var s string
		if json.Unmarshal(v, &s) != nil {
			var buf bytes.Buffer
			if json.Compact(&buf, v) == nil {
				s = buf.String()
			} else {
				s = string(v)
			}
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
		b.WriteString(": ")
		b.WriteString(s)
	}
	return clean(b.String(), limit)
}
