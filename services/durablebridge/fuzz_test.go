package durablebridge

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzPost runs a phone's POST body through what the handler does with it
// before anything runs: the decode, the id checks, parsePost for every
// POST route, and the fingerprint. No panic; a command's text is what the
// session service can store (no NUL, valid UTF-8, within the limit); a
// rename's title is one clean non-empty line; and the fingerprint leaves
// requestId out and is the same for the same body.
func FuzzPost(f *testing.F) {
	for _, s := range []string{
		`{"requestId":"r1","askId":"a1","revision":1,"answer":{"option":"allow"}}`,
		`{"requestId":"r1","askId":"a1","revision":9223372036854775808,"answer":{"option":"allow"}}`,
		`{"requestId":"r1","askId":"a1","revision":1.0,"answer":{}}`,
		`{"requestId":"r1","text":"hello","turn":null}`,
		`{"requestId":"r1","text":"hello\u0000world","turn":"t1"}`,
		`{"requestId":"r1","text":" \u0000 "}`,
		`{"requestId":"r1","turn":"t1"}`,
		`{"requestId":"r1","action":"a1"}`,
		`{"requestId":"r1","target":{"workspace":"ws-main"},"title":"x"}`,
		`{"requestId":"r1","target":{"tab":"t"},"title":"\u202e\n\t "}`,
		`{"requestId":"r1","target":{"pane":"a","tab":"b"}}`,
		`{"requestId":"r1","target":{"pane":"a"}}`,
		`{"requestId":"r1","text":7}`,
		`{"requestId":"r1","conversation":"c1"}`,
		`{"requestId":"has space","askId":1}`,
		`{"requestId":7}`,
		`{"requestId":"r1"}} `,
		` `,
		`[]`,
	} {
		f.Add([]byte(s), uint8(0))
	}
	var posts []*route
	for _, rt := range routes {
		if rt.method == http.MethodPost {
			posts = append(posts, rt)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte, which uint8) {
		body, ok := postBody(raw)
		if !ok {
			return
		}
		if body == nil {
			t.Fatalf("postBody(%q) accepted a nil object", raw)
		}
		again, _ := json.Marshal(body)
		if b2, ok := postBody(again); !ok || len(b2) != len(body) {
			t.Fatalf("postBody(%q) = %v, which re-encoded as %s reads %v, %v", raw, body, again, b2, ok)
		}
		rt := posts[int(which)%len(posts)]
		for _, field := range rt.ids {
			lookup(body, field)
		}
		ids := []string{"p1"}
		cmd, msg := parsePost(rt.name, body, ids)
		if cmd == nil {
			if msg == "" {
				t.Fatalf("%s %q: refused without a reason", rt.name, raw)
			}
			return
		}
		var text string
		switch c := cmd.(type) {
		case *sendCmd:
			text = c.text
			if strings.TrimSpace(text) == "" {
				t.Fatalf("send of %d bytes: a blank text was accepted", len(raw))
			}
		case *starterCmd:
			text = c.text
		case *renameCmd:
			if c.title == "" || c.title != cleanLine(c.title, maxTitle) || strings.ContainsAny(c.title, "\n\r\t") {
				t.Fatalf("rename %q: title %q is not one clean line", raw, c.title)
			}
		case *answerCmd:
			if c.revision < 1 {
				t.Fatalf("answer %q: revision %d", raw, c.revision)
			}
		}
		if len(text) > maxPhoneText || !utf8.ValidString(text) || strings.IndexByte(text, 0) >= 0 {
			t.Fatalf("%s %q: text %q cannot be stored", rt.name, raw, text)
		}
		path := routeBase + strings.ReplaceAll(strings.Join(rt.segs, "/"), ":", "p1")
		fp := fingerprint(http.MethodPost, path, body)
		other := map[string]any{"requestId": "another"}
		for k, v := range body {
			if k != "requestId" {
				other[k] = v
			}
		}
		if fingerprint(http.MethodPost, path, other) != fp {
			t.Fatalf("%q: the fingerprint depends on requestId", raw)
		}
	})
}

// FuzzRoute checks the router on arbitrary escaped paths: a match has
// one param per ":" segment, the path rebuilds from the route and its
// params, and an id that passes validID unescapes to no separator.
func FuzzRoute(f *testing.F) {
	for _, rt := range routes {
		f.Add(rt.method, strings.ReplaceAll(strings.Join(rt.segs, "/"), ":", "a%2Fb"))
	}
	f.Add("GET", "pane//events")
	f.Add("POST", "starter/%zz")
	f.Fuzz(func(t *testing.T, method, rest string) {
		rt, params := match(method, rest)
		if rt == nil {
			if params != nil {
				t.Fatalf("match(%q, %q): params %q without a route", method, rest, params)
			}
			return
		}
		if rt.method != method {
			t.Fatalf("match(%q, %q) = %s", method, rest, rt.name)
		}
		var segs []string
		i := 0
		for _, s := range rt.segs {
			if s == ":" {
				s = params[i]
				i++
			}
			segs = append(segs, s)
		}
		if i != len(params) || strings.Join(segs, "/") != rest {
			t.Fatalf("match(%q, %q) = %s %q", method, rest, rt.name, params)
		}
		for _, p := range params {
			id, err := url.PathUnescape(p)
			if err == nil && validID(id) && (strings.ContainsAny(id, "/?#") || bytes.ContainsAny([]byte(id), " \x00")) {
				t.Fatalf("id %q passed validID", id)
			}
		}
	})
}
