// Package collietest is a durable-wire client that behaves as Collie, the
// phone bridge, does (seed 004): it checks the private socket's path
// before each connection, calls hello first without the version header
// and sends the version on every later call, polls the snapshot with
// If-None-Match, reads each pane's events with its cursor and epoch
// (taking the pane's whole view on a reset), and sends every POST with a
// request id, the same id again on a retry. Tests drive the durable
// bridge with it; it is written from seed 004 and WIRE.md only.
package collietest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Timeouts bound whole exchanges, connection to last byte.
type Timeouts struct {
	// Read covers hello, snapshot and events (Collie: 1000 ms on the
	// socket, 5000 ms over TLS).
	Read time.Duration
	// Post covers an answer, send, abort, action, rename or close (3000
	// ms on the socket, 5000 ms over TLS).
	Post time.Duration
	// Starter covers a starter (30000 ms).
	Starter time.Duration
}

// SocketTimeouts are Collie's on the private socket.
var SocketTimeouts = Timeouts{Read: time.Second, Post: 3 * time.Second, Starter: 30 * time.Second}

// Response limits of seed 004: Collie reads no further.
const (
	limitHello    = 16 << 10
	limitSnapshot = 4 << 20
	limitEvents   = 8 << 20
	limitHistory  = 1 << 20
	limitItems    = 8 << 20
	limitPost     = 16 << 10
)

// ErrNotPrivate: the socket path failed Collie's check.
var ErrNotPrivate = errors.New("socket-not-private")

// Client is one Collie talking to one durable agent.
type Client struct {
	http     *http.Client
	base     string
	token    string
	Timeouts Timeouts

	mu sync.Mutex
	// Version is the version chosen at hello (0 before).
	Version int
	// Hello is the last hello read.
	Hello *Hello
	// Snap is the last snapshot read, ETag its tag.
	Snap *Snapshot
	ETag string
	// Panes are the panes' views, by id.
	Panes map[string]*PaneView
}

// Socket returns a client of the durable agent at path, which it checks
// before each connection as Collie does.
func Socket(path string) *Client {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		if err := CheckSocketPath(path); err != nil {
			return nil, err
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
	tr := &http.Transport{DialContext: dial, MaxIdleConns: 4, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	return &Client{http: &http.Client{Transport: tr, CheckRedirect: noRedirect}, base: "http://durable/session/v1", Timeouts: SocketTimeouts, Panes: map[string]*PaneView{}}
}

// URL returns a client of the durable agent at base (https://, or
// http://127.0.0.1:<port> for a local test) with a bearer token.
func URL(base, token string, client *http.Client) *Client {
	if client == nil {
		client = &http.Client{}
	}
	cp := *client
	cp.CheckRedirect = noRedirect
	return &Client{http: &cp, base: strings.TrimSuffix(base, "/") + "/session/v1", token: token,
		Timeouts: Timeouts{Read: 5 * time.Second, Post: 5 * time.Second, Starter: 30 * time.Second}, Panes: map[string]*PaneView{}}
}

// noRedirect: Collie follows no redirect, so the token never reaches
// another host.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// CheckSocketPath is Collie's check before each connection: the path is
// clean, every part of it is checked with lstat, none is a symbolic link,
// the socket's folder is the user's with mode 0700, no folder above it is
// writable by group or others unless sticky, the socket is the user's with
// no group or other bits.
func CheckSocketPath(path string) error {
	fail := func(part, why string) error { return fmt.Errorf("%w: %s: %s", ErrNotPrivate, part, why) }
	if !filepath.IsAbs(path) || len(path) > 103 {
		return fail(path, "not an absolute path of at most 103 bytes")
	}
	// The parts checked below are the cleaned path's; the kernel follows
	// the path as written, through a symbolic link before a `..` too.
	if filepath.Clean(path) != path {
		return fail(path, "not a clean path (no //, . or .. parts)")
	}
	uid := os.Getuid()
	dir := filepath.Dir(path)
	cur := "/"
	parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	for i := -1; i < len(parts); i++ {
		if i >= 0 {
			cur = filepath.Join(cur, parts[i])
		}
		fi, err := os.Lstat(cur)
		if err != nil {
			return fail(cur, err.Error())
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fail(cur, "symbolic link")
		}
		if cur == dir {
			st, _ := fi.Sys().(*syscall.Stat_t)
			if st == nil || int(st.Uid) != uid || fi.Mode().Perm() != 0o700 {
				return fail(cur, "the socket's folder must be yours with mode 0700")
			}
		} else if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fail(cur, "writable by group or others")
		}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(path, err.Error())
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if fi.Mode()&fs.ModeSocket == 0 || st == nil || int(st.Uid) != uid || fi.Mode().Perm()&0o077 != 0 {
		return fail(path, "the socket must be yours, with no group or other permissions")
	}
	return nil
}

// Reply is one response.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v.
func (r *Reply) JSON(v any) error { return json.Unmarshal(r.Body, v) }

// Code is the body's "code" field ("" when none).
func (r *Reply) Code() string {
	var e struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(r.Body, &e)
	return e.Code
}

func (r *Reply) String() string { return fmt.Sprintf("%d %s", r.Status, r.Body) }

// Do sends one request as it is: hdr is added to the client's own headers
// (token; version once chosen); limit bounds the body read (0: 8 MiB).
func (c *Client) Do(ctx context.Context, method, path string, hdr http.Header, body []byte, timeout time.Duration, limit int) (*Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	c.mu.Lock()
	if c.Version > 0 {
		req.Header.Set("X-Collie-Session", strconv.Itoa(c.Version))
	}
	c.mu.Unlock()
	for k, vs := range hdr {
		req.Header.Del(k)
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if limit == 0 {
		limit = limitEvents
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > limit {
		// A response over its limit is not read.
		return nil, fmt.Errorf("%s %s: response over its %d-byte limit", method, path, limit)
	}
	return &Reply{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
}

// Hello is hello's answer.
type Hello struct {
	Service  string `json:"service"`
	Protocol struct {
		Min int `json:"min"`
		Max int `json:"max"`
	} `json:"protocol"`
	Host struct {
		Name string `json:"name"`
	} `json:"host"`
	Epoch string          `json:"epoch"`
	Ready bool            `json:"ready"`
	Caps  map[string]bool `json:"caps"`
}

// Speaks is the version range this Collie speaks.
const Speaks = 1

// SayHello calls hello without the version header and picks the highest
// version both sides speak. A new epoch drops the snapshot's tag (the
// panes keep their cursors: their next read resets them).
func (c *Client) SayHello(ctx context.Context) (*Hello, error) {
	c.mu.Lock()
	c.Version = 0
	c.mu.Unlock()
	r, err := c.Do(ctx, http.MethodGet, "/hello", nil, nil, c.Timeouts.Read, limitHello)
	if err != nil {
		return nil, err
	}
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("hello: %s", r)
	}
	var h Hello
	if err := r.JSON(&h); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	if h.Service != "collie-durable" {
		return nil, fmt.Errorf("hello: service %q is not a durable agent", h.Service)
	}
	if h.Protocol.Min > Speaks || h.Protocol.Max < Speaks {
		return &h, fmt.Errorf("hello: the agent speaks %d..%d, this Collie %d", h.Protocol.Min, h.Protocol.Max, Speaks)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Version = min(h.Protocol.Max, Speaks)
	if c.Hello == nil || c.Hello.Epoch != h.Epoch {
		c.ETag = ""
	}
	c.Hello = &h
	return &h, nil
}

// Snapshot is the layout.
type Snapshot struct {
	Epoch      string `json:"epoch"`
	Rev        int64  `json:"rev"`
	Workspaces []struct {
		ID    string `json:"id"`
		Title string `json:"title"`
		Tabs  []struct {
			ID    string `json:"id"`
			Title string `json:"title"`
			Panes []Pane `json:"panes"`
		} `json:"tabs"`
	} `json:"workspaces"`
	Starters []struct {
		ID          string `json:"id"`
		Title       string `json:"title"`
		Description string `json:"description"`
	} `json:"starters"`
}

// Pane is a pane in a snapshot.
type Pane struct {
	ID      string `json:"id"`
	Title   string `json:"title"`
	State   string `json:"state"`
	Turn    *Turn  `json:"turn"`
	Asks    []Ask  `json:"asks"`
	Actions []struct {
		ID    string `json:"id"`
		Label string `json:"label"`
	} `json:"actions"`
}

// Turn is a running turn.
type Turn struct {
	ID        string `json:"id"`
	StartedAt string `json:"startedAt"`
}

// Ask is an open ask.
type Ask struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Revision int64  `json:"revision"`
	Title    string `json:"title"`
	Body     string `json:"body"`
	Tool     *struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"tool"`
	Options []struct {
		ID    string `json:"id"`
		Label string `json:"label"`
	} `json:"options"`
	ExpiresAt string `json:"expiresAt"`
}

// Pane finds a pane of the last snapshot.
func (s *Snapshot) Pane(id string) *Pane {
	if s == nil {
		return nil
	}
	for _, w := range s.Workspaces {
		for _, t := range w.Tabs {
			for i := range t.Panes {
				if t.Panes[i].ID == id {
					return &t.Panes[i]
				}
			}
		}
	}
	return nil
}

// AllPanes lists the panes of the snapshot.
func (s *Snapshot) AllPanes() []Pane {
	var out []Pane
	if s == nil {
		return out
	}
	for _, w := range s.Workspaces {
		for _, t := range w.Tabs {
			out = append(out, t.Panes...)
		}
	}
	return out
}

// Poll reads the snapshot with If-None-Match: changed is false on a 304,
// which keeps the last snapshot.
func (c *Client) Poll(ctx context.Context) (changed bool, r *Reply, err error) {
	c.mu.Lock()
	hdr := http.Header{}
	if c.ETag != "" {
		hdr.Set("If-None-Match", c.ETag)
	}
	c.mu.Unlock()
	r, err = c.Do(ctx, http.MethodGet, "/snapshot", hdr, nil, c.Timeouts.Read, limitSnapshot)
	if err != nil {
		return false, nil, err
	}
	switch r.Status {
	case http.StatusNotModified:
		return false, r, nil
	case http.StatusOK:
	default:
		return false, r, fmt.Errorf("snapshot: %s", r)
	}
	var s Snapshot
	if err := r.JSON(&s); err != nil {
		return false, r, fmt.Errorf("snapshot: %w", err)
	}
	c.mu.Lock()
	c.Snap, c.ETag = &s, r.Header.Get("ETag")
	c.mu.Unlock()
	return true, r, nil
}

// Item is a pane item.
type Item struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Text string `json:"text"`
	At   string `json:"at"`
}

// Event is one pane event.
type Event struct {
	Seq     int64           `json:"seq"`
	Type    string          `json:"type"`
	Item    *Item           `json:"item"`
	Ask     *Ask            `json:"ask"`
	AskID   string          `json:"askId"`
	By      string          `json:"by"`
	Outcome json.RawMessage `json:"outcome"`
	Turn    *Turn           `json:"turn"`
	State   string          `json:"state"`
}

// EventsPage is one events response.
type EventsPage struct {
	Epoch  string  `json:"epoch"`
	Cursor int64   `json:"cursor"`
	Reset  bool    `json:"reset"`
	Events []Event `json:"events"`
	Items  []Item  `json:"items"`
	Asks   []Ask   `json:"asks"`
	Turn   *Turn   `json:"turn"`
	State  string  `json:"state"`
}

// PaneView is what Collie shows of a pane, built from its events.
type PaneView struct {
	Epoch  string
	Cursor int64
	Items  []Item
	Asks   map[string]Ask
	Turn   *Turn
	State  string
	// Closed lists the ask-closed events seen, in order.
	Closed []Event
	// Resets counts the whole views taken.
	Resets int
}

// Item returns the item with id, if shown.
func (v *PaneView) Item(id string) (Item, bool) {
	for _, it := range v.Items {
		if it.ID == id {
			return it, true
		}
	}
	return Item{}, false
}

// Text joins the items of a kind.
func (v *PaneView) Text(kind string) string {
	var b strings.Builder
	for _, it := range v.Items {
		if it.Kind == kind {
			b.WriteString(it.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Events reads a pane's events after its cursor and applies them to its
// view; a reset replaces the view.
func (c *Client) Events(ctx context.Context, pane string) (*EventsPage, error) {
	c.mu.Lock()
	v := c.Panes[pane]
	if v == nil {
		v = &PaneView{Asks: map[string]Ask{}}
		c.Panes[pane] = v
	}
	q := "after=" + strconv.FormatInt(v.Cursor, 10)
	if v.Epoch != "" {
		q += "&epoch=" + v.Epoch
	}
	c.mu.Unlock()
	r, err := c.Do(ctx, http.MethodGet, "/pane/"+pane+"/events?"+q, nil, nil, c.Timeouts.Read, limitEvents)
	if err != nil {
		return nil, err
	}
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("events of %s: %s", pane, r)
	}
	var p EventsPage
	if err := r.JSON(&p); err != nil {
		return nil, fmt.Errorf("events of %s: %w", pane, err)
	}
	if len(p.Events) > 1000 {
		return nil, fmt.Errorf("events of %s: %d events in one response", pane, len(p.Events))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v.Epoch, v.Cursor = p.Epoch, p.Cursor
	if p.Reset {
		v.Resets++
		v.Items = append([]Item(nil), p.Items...)
		v.Asks = map[string]Ask{}
		for _, a := range p.Asks {
			v.Asks[a.ID] = a
		}
		v.Turn, v.State = p.Turn, p.State
		return &p, nil
	}
	for _, e := range p.Events {
		switch e.Type {
		case "item":
			replaced := false
			for i := range v.Items {
				if v.Items[i].ID == e.Item.ID {
					v.Items[i], replaced = *e.Item, true
				}
			}
			if !replaced {
				v.Items = append(v.Items, *e.Item)
			}
		case "ask", "ask-changed":
			v.Asks[e.Ask.ID] = *e.Ask
		case "ask-closed":
			delete(v.Asks, e.AskID)
			v.Closed = append(v.Closed, e)
		case "turn":
			v.Turn, v.State = e.Turn, e.State
		}
	}
	return &p, nil
}

// View returns a copy of a pane's view.
func (c *Client) View(pane string) PaneView {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.Panes[pane]
	if v == nil {
		return PaneView{}
	}
	cp := *v
	cp.Items = append([]Item(nil), v.Items...)
	cp.Closed = append([]Event(nil), v.Closed...)
	cp.Asks = make(map[string]Ask, len(v.Asks))
	for k, a := range v.Asks {
		cp.Asks[k] = a
	}
	return cp
}

// NewRequestID makes a request id for one intent.
func NewRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}

// Post sends one intent with request id id (body gets "requestId"); a
// retry of the same intent sends the same id. Starters get their longer
// timeout.
func (c *Client) Post(ctx context.Context, path, id string, body map[string]any) (*Reply, error) {
	cp := make(map[string]any, len(body)+1)
	for k, v := range body {
		cp[k] = v
	}
	cp["requestId"] = id
	raw, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	timeout := c.Timeouts.Post
	if strings.HasPrefix(path, "/starter/") {
		timeout = c.Timeouts.Starter
	}
	return c.Do(ctx, http.MethodPost, path, nil, raw, timeout, limitPost)
}

// Answer taps option on an ask.
func (c *Client) Answer(ctx context.Context, pane, id string, a Ask, option string) (*Reply, error) {
	return c.Post(ctx, "/pane/"+pane+"/answer", id, map[string]any{"askId": a.ID, "revision": a.Revision, "answer": map[string]any{"option": option}})
}

// Conversations reads one history page.
func (c *Client) Conversations(ctx context.Context, query string) (*Reply, error) {
	path := "/conversations"
	if query != "" {
		path += "?" + query
	}
	return c.Do(ctx, http.MethodGet, path, nil, nil, c.Timeouts.Read, limitHistory)
}

// Items reads one page of a conversation's items.
func (c *Client) Items(ctx context.Context, conv, query string) (*Reply, error) {
	path := "/conversation/" + conv + "/items"
	if query != "" {
		path += "?" + query
	}
	return c.Do(ctx, http.MethodGet, path, nil, nil, c.Timeouts.Read, limitItems)
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }
