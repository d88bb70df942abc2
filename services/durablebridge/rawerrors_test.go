package durablebridge

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawExchange writes req on a new connection made by dial and reads the
// one response.
func rawExchange(t *testing.T, dial func() (net.Conn, error), req string) (*http.Response, []byte) {
	t.Helper()
	nc, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(nc, req); err != nil {
		t.Fatalf("write %q: %v", firstLine(req), err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	if err != nil {
		t.Fatalf("%q: no response: %v", firstLine(req), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	if len(l) > 60 {
		l = l[:60] + "…"
	}
	return l
}

// wantWireError checks a response is the wire's error shape.
func wantWireError(t *testing.T, req string, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	var e wireError
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &e) != nil || e.Code != code {
		t.Errorf("%q: want %d %q as JSON, got %d %q %q", firstLine(req), status, code, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// Requests net/http refuses before any handler runs (a malformed request
// line, no Host, an HTTP version it does not speak, a header past its
// bound, a transfer coding it does not know, an Expect it does not meet)
// were answered in plain text ("400 Bad Request", "431 Request Header
// Fields Too Large", ...), and "OPTIONS *" got an empty 200: none of them
// the wire's {"code"} shape. Over the socket they are 400 bad-request
// now, and behind the token, where the token is checked first and could
// not be, a bare 401 unauthorized.
func TestRefusalsBeforeTheHandlerAreWireErrors(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	const token = "0123456789abcdefghijklmnopqrstuvwxyz!#"
	w.b.SetToken(token)
	ln, pool := serveToken(t, w)

	malformed := []string{
		"GARBAGE\r\n\r\n",
		"GET /session/v1/hello\r\n\r\n",
		"GET /session/v1/hello HTTP/1.1\r\n\r\n",
		"GET /session/v1/hello HTTP/1.1\r\nHost: durable\r\nBad Header\r\n\r\n",
		"GET /session/v1/hello HTTP/3.0\r\nHost: durable\r\n\r\n",
		"GET /session/v1/hello HTTP/1.1\r\nHost: durable\r\nX-Pad: " + strings.Repeat("x", 32<<10) + "\r\n\r\n",
		"POST /session/v1/close HTTP/1.1\r\nHost: durable\r\nX-Collie-Session: 1\r\nTransfer-Encoding: gzip\r\n\r\n",
		"GET /session/v1/hello HTTP/1.1\r\nHost: durable\r\nExpect: a-teapot\r\n\r\n",
	}
	overSocket := func() (net.Conn, error) { return net.Dial("unix", w.socket) }
	overTLS := func() (net.Conn, error) {
		return tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool})
	}
	for _, req := range malformed {
		resp, body := rawExchange(t, overSocket, req)
		wantWireError(t, req, resp, body, http.StatusBadRequest, codeBadRequest)
		resp, body = rawExchange(t, overTLS, req)
		wantWireError(t, req, resp, body, http.StatusUnauthorized, codeUnauthorized)
		if string(body) != `{"code":"unauthorized"}` {
			t.Errorf("%q behind the token said more: %s", firstLine(req), body)
		}
	}

	// Plain http to the https address was told so in plain text.
	plain := "GET /agent/session/v1/hello HTTP/1.1\r\nHost: durable\r\n\r\n"
	resp, body := rawExchange(t, func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }, plain)
	wantWireError(t, plain, resp, body, http.StatusBadRequest, codeBadRequest)
	if !strings.Contains(string(body), "https") {
		t.Errorf("plain http to the https address: %s", body)
	}

	// "OPTIONS *" is a route like any other: not one of the wire's.
	opts := "OPTIONS * HTTP/1.1\r\nHost: durable\r\nX-Collie-Session: 1\r\n\r\n"
	resp, body = rawExchange(t, overSocket, opts)
	wantWireError(t, opts, resp, body, http.StatusNotFound, codeNotFound)
	resp, body = rawExchange(t, overTLS, opts)
	wantWireError(t, opts, resp, body, http.StatusUnauthorized, codeUnauthorized)

	// A well-formed request on the same kind of connection is served as
	// before, and keeps its connection.
	nc, err := overSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	for range 2 {
		if _, err := io.WriteString(nc, "GET /session/v1/hello HTTP/1.1\r\nHost: durable\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		var h wireHello
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || h.Epoch != testEpoch {
			t.Fatalf("hello: %d %+v %v", resp.StatusCode, h, err)
		}
	}
}
