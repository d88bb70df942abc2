package durablebridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// HeaderVersion carries the wire version on every call after hello.
const HeaderVersion = "X-Collie-Session"

// routeBase prefixes every route.
const routeBase = "/session/v1/"

// route is one method and path of the wire; ":" segments are ids.
type route struct {
	method string
	segs   []string
	name   string
	limit  int
	// ids lists the body fields that are ids (checked before the body's
	// shape, as WIRE.md orders the refusals).
	ids []string
	// timeout bounds a POST's work (it goes on when the phone leaves, so
	// its answer can be replayed).
	timeout time.Duration
}

var routes = []*route{
	{method: http.MethodGet, segs: []string{"hello"}, name: "hello", limit: limitHello},
	{method: http.MethodGet, segs: []string{"snapshot"}, name: "snapshot", limit: limitSnapshot},
	{method: http.MethodGet, segs: []string{"pane", ":", "events"}, name: "events", limit: limitEvents},
	{method: http.MethodPost, segs: []string{"pane", ":", "answer"}, name: "answer", limit: limitPost, ids: []string{"askId"}, timeout: 10 * time.Second},
	{method: http.MethodPost, segs: []string{"pane", ":", "send"}, name: "send", limit: limitPost, ids: []string{"turn"}, timeout: 10 * time.Second},
	{method: http.MethodPost, segs: []string{"pane", ":", "abort"}, name: "abort", limit: limitPost, ids: []string{"turn"}, timeout: 10 * time.Second},
	{method: http.MethodPost, segs: []string{"pane", ":", "action"}, name: "action", limit: limitPost, ids: []string{"action"}, timeout: 10 * time.Second},
	{method: http.MethodPost, segs: []string{"rename"}, name: "rename", limit: limitPost, ids: []string{"target.workspace", "target.tab"}, timeout: 10 * time.Second},
	{method: http.MethodPost, segs: []string{"close"}, name: "close", limit: limitPost, ids: []string{"target.pane", "target.tab", "target.workspace"}, timeout: 20 * time.Second},
	{method: http.MethodPost, segs: []string{"starter", ":"}, name: "starter", limit: limitPost, timeout: 25 * time.Second},
	{method: http.MethodGet, segs: []string{"conversations"}, name: "conversations", limit: limitConversations},
	{method: http.MethodGet, segs: []string{"conversation", ":", "items"}, name: "items", limit: limitItems},
	{method: http.MethodPost, segs: []string{"reopen"}, name: "reopen", limit: limitPost, ids: []string{"conversation"}, timeout: 10 * time.Second},
}

// match finds the route of a method and an escaped path below the base;
// params are the ":" segments, still escaped.
func match(method, rest string) (*route, []string) {
	n := strings.Count(rest, "/") + 1
	for _, rt := range routes {
		if rt.method != method || len(rt.segs) != n {
			continue
		}
		var params []string
		tail := rest
		ok := true
		for _, s := range rt.segs {
			seg, after, _ := strings.Cut(tail, "/")
			tail = after
			if s == ":" {
				params = append(params, seg)
			} else if s != seg {
				ok = false
				break
			}
		}
		if ok {
			return rt, params
		}
	}
	return nil, nil
}

// handler serves the wire on one transport.
type handler struct {
	b      *Bridge
	tr     transport
	prefix string
}

// ServeHTTP applies the common rules in WIRE.md's order (unauthorized,
// version-required / incompatible, not-found, starting, too-large,
// bad-id, bad-request), then the route.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b := h.b
	b.handlers.Add(1)
	defer b.handlers.Done()
	if h.tr == overToken {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !b.tokenOK(token) || !ok {
			h.fail(w, http.StatusUnauthorized, codeUnauthorized, "")
			return
		}
	} else if b.cfg.RefuseDescendants() {
		if pid, ok := r.Context().Value(peerKey{}).(int); ok && descendsFrom(pid, b.launcher) {
			h.fail(w, http.StatusForbidden, codeCallerRefused, "this durable agent refuses its own descendants")
			return
		}
	}
	var rt *route
	var params []string
	if rest, ok := strings.CutPrefix(r.URL.EscapedPath(), h.prefix+routeBase); ok {
		rt, params = match(r.Method, rest)
	}
	if vals := r.Header.Values(HeaderVersion); len(vals) > 0 {
		v, err := strconv.Atoi(strings.TrimSpace(vals[0]))
		if err != nil || len(vals) > 1 {
			h.fail(w, http.StatusBadRequest, codeVersionRequired, HeaderVersion+" must be one integer")
			return
		}
		if v != ProtocolVersion {
			h.incompatible(w, v)
			return
		}
	} else if rt == nil || rt.name != "hello" {
		h.fail(w, http.StatusBadRequest, codeVersionRequired, "every call after hello carries "+HeaderVersion)
		return
	}
	if rt == nil {
		h.fail(w, http.StatusNotFound, codeNotFound, "")
		return
	}
	if rt.name != "hello" && !b.layout.Ready() {
		msg := "the durable agent is arranging its panes"
		if m := b.startingMsg.Load(); m != nil {
			msg = *m
		}
		h.fail(w, http.StatusServiceUnavailable, codeStarting, msg)
		return
	}
	if r.ContentLength > maxBody {
		h.fail(w, http.StatusRequestEntityTooLarge, codeTooLarge, "")
		return
	}
	var body []byte
	if r.ContentLength != 0 {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if len(body) > maxBody {
			h.fail(w, http.StatusRequestEntityTooLarge, codeTooLarge, "")
			return
		}
		if err != nil {
			h.fail(w, http.StatusBadRequest, codeBadRequest, "the body could not be read")
			return
		}
	}
	var ids []string
	if len(params) > 0 {
		ids = make([]string, len(params))
	}
	for i, p := range params {
		id, err := url.PathUnescape(p)
		if err != nil || !validID(id) {
			h.fail(w, http.StatusBadRequest, codeBadID, "")
			return
		}
		ids[i] = id
	}
	if rt.method == http.MethodPost {
		h.post(w, r, rt, ids, body)
		return
	}
	switch rt.name {
	case "hello":
		h.reply(w, rt, http.StatusOK, b.hello())
	case "snapshot":
		h.snapshot(w, r)
	case "events":
		h.events(w, r, rt, ids[0])
	case "conversations":
		st, v := b.conversations(r.Context(), r.URL.Query())
		h.reply(w, rt, st, v)
	case "items":
		st, v := b.items(r.Context(), ids[0], r.URL.Query())
		h.reply(w, rt, st, v)
	}
}

// incompatible answers a version this bridge does not speak with both
// ranges (the informative hello), logging it once per epoch.
func (h *handler) incompatible(w http.ResponseWriter, v int) {
	if h.b.incompatibleLogged.CompareAndSwap(false, true) {
		h.b.log.Warn("durable wire version mismatch", zap.Int("collie", v), zap.Int("agent_min", ProtocolVersion), zap.Int("agent_max", ProtocolVersion))
	}
	var ref wireRefusal
	ref.Code = codeIncompatible
	ref.Refusal.Agent = versionRange{Min: ProtocolVersion, Max: ProtocolVersion}
	ref.Refusal.Collie = versionRange{Min: v, Max: v}
	h.write(w, http.StatusConflict, mustJSON(ref))
}

func (b *Bridge) hello() wireHello {
	return wireHello{
		Service:  ServiceName,
		Protocol: versionRange{Min: ProtocolVersion, Max: ProtocolVersion},
		Host:     wireHost{Name: cleanLine(b.cfg.HostName, maxTitle)},
		Epoch:    b.layout.Epoch(),
		Ready:    b.layout.Ready(),
		Caps:     map[string]bool{"starters": true, "history": true, "rename": true, "close": true, "actions": true, "abort": true},
	}
}

// snapshot answers 304 when If-None-Match names the current tag (after
// stripping W/): a poll that finds nothing new costs one comparison.
func (h *handler) snapshot(w http.ResponseWriter, r *http.Request) {
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		if tag := h.b.layout.ETag(); etagMatches(inm, tag) {
			w.Header()["Etag"] = []string{tag}
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	tag, body := h.b.layout.Snapshot(h.tr)
	w.Header()["Etag"] = []string{tag}
	h.write(w, http.StatusOK, body)
}

// etagMatches compares an If-None-Match list with tag, weak or not.
func etagMatches(inm, tag string) bool {
	for inm != "" {
		var one string
		one, inm, _ = strings.Cut(inm, ",")
		one = strings.TrimSpace(one)
		if one == "*" || strings.TrimPrefix(one, "W/") == tag {
			return true
		}
	}
	return false
}

func (h *handler) events(w http.ResponseWriter, r *http.Request, rt *route, paneID string) {
	q := r.URL.Query()
	var after int64
	hasAfter := q.Has("after")
	if hasAfter {
		n, err := strconv.ParseInt(q.Get("after"), 10, 64)
		if err != nil || n < 0 {
			h.fail(w, http.StatusBadRequest, codeBadRequest, "`after` must be a cursor (a number from 0)")
			return
		}
		after = n
	}
	body, ok := h.b.layout.paneEvents(paneID, q.Get("epoch"), after, hasAfter, h.tr)
	if !ok {
		h.fail(w, http.StatusNotFound, codeNoSuchPane, "")
		return
	}
	h.writeLimited(w, rt, http.StatusOK, body)
}

// post runs a POST once per request id.
func (h *handler) post(w http.ResponseWriter, r *http.Request, rt *route, ids []string, raw []byte) {
	body, ok := postBody(raw)
	if !ok {
		h.fail(w, http.StatusBadRequest, codeBadRequest, "the body must be one JSON object")
		return
	}
	reqID, hasID := body["requestId"]
	idStr, isStr := reqID.(string)
	if hasID && (!isStr || !validID(idStr)) {
		h.fail(w, http.StatusBadRequest, codeBadID, "`requestId` is not an id")
		return
	}
	for _, field := range rt.ids {
		if v, ok := lookup(body, field); ok && v != nil {
			if s, isStr := v.(string); !isStr || !validID(s) {
				h.fail(w, http.StatusBadRequest, codeBadID, "`"+field+"` is not an id")
				return
			}
		}
	}
	if !hasID {
		h.fail(w, http.StatusBadRequest, codeBadRequest, "`requestId` is required")
		return
	}
	cmd, msg := parsePost(rt.name, body, ids)
	if cmd == nil {
		h.fail(w, http.StatusBadRequest, codeBadRequest, msg)
		return
	}
	path := strings.TrimPrefix(r.URL.EscapedPath(), h.prefix)
	fp := fingerprint(http.MethodPost, path, body)
	status, out, err := h.b.memory.do(r.Context(), idStr, fp, func() (int, []byte) {
		// The work outlives the phone's connection (its retry must find the
		// answer), not the bridge.
		ctx, cancel := context.WithTimeout(h.b.base, rt.timeout)
		defer cancel()
		st, v := cmd.run(ctx, h.b, h.tr)
		return st, mustJSON(v)
	})
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			h.b.log.Warn("request id memory", zap.String("route", rt.name), zap.Error(err))
		}
		h.fail(w, http.StatusServiceUnavailable, codeUnavailable, "the request could not be recorded; send it again with the same requestId")
		return
	}
	h.writeLimited(w, rt, status, out)
}

// postBody decodes a POST body: one JSON object (numbers kept as
// json.Number), or nothing but white space for an empty one.
func postBody(raw []byte) (map[string]any, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return map[string]any{}, true
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	// Nothing but white space may follow the object: dec.More alone let
	// a stray `}` or `]` through.
	if err := dec.Decode(&v); err != nil || !atEOF(dec) {
		return nil, false
	}
	obj, ok := v.(map[string]any)
	return obj, ok
}

// atEOF reports whether dec has nothing left but white space.
func atEOF(dec *json.Decoder) bool {
	_, err := dec.Token()
	return err == io.EOF
}

// lookup reads a dotted field of a JSON object.
func lookup(body map[string]any, field string) (any, bool) {
	first, rest, nested := strings.Cut(field, ".")
	v, ok := body[first]
	if !ok || !nested {
		return v, ok
	}
	obj, isObj := v.(map[string]any)
	if !isObj {
		return nil, false
	}
	return lookup(obj, rest)
}

func (h *handler) reply(w http.ResponseWriter, rt *route, status int, v any) {
	h.writeLimited(w, rt, status, mustJSON(v))
}

// writeLimited writes a response that must stay under its route's limit;
// the renderers keep to it, so a breach is a bug, logged and not sent.
func (h *handler) writeLimited(w http.ResponseWriter, rt *route, status int, body []byte) {
	if len(body) > rt.limit {
		h.b.log.Error("durable response over its limit", zap.String("route", rt.name), zap.Int("bytes", len(body)), zap.Int("limit", rt.limit))
		h.fail(w, http.StatusInternalServerError, "internal", "")
		return
	}
	h.write(w, status, body)
}

func (h *handler) fail(w http.ResponseWriter, status int, code, msg string) {
	h.write(w, status, mustJSON(wireError{Code: code, Message: msg}))
}

func (h *handler) write(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	hdr["Content-Type"] = []string{"application/json"}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	hdr["Cache-Control"] = []string{"no-store"}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Every value marshalled here is built from plain fields.
		panic(err)
	}
	return b
}
