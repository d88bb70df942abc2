package durablebridge

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
)

// serveWire serves srv, built by httpServer for tr, on ln.
func serveWire(srv *http.Server, ln net.Listener, tr transport) error {
	return srv.Serve(wireConns(ln, tr))
}

// wireConns wraps ln's connections (above TLS) so that the refusals
// net/http writes on its own, before any handler runs, have the wire's
// shape: every error is JSON with a code (WIRE.md). net/http offers no
// hook for them: a request it cannot read (a malformed request line, no
// Host, an HTTP version it does not speak, a header past
// MaxHeaderBytes, a transfer coding it does not know) is answered in
// plain text straight on the connection, and an Expect other than
// 100-continue with an empty 417. Over the socket each is 400
// bad-request, saying what net/http said; behind the token, which is
// checked first and could not be read, a bare 401 unauthorized.
func wireConns(ln net.Listener, tr transport) net.Listener {
	return &wireListener{Listener: ln, tr: tr}
}

type wireListener struct {
	net.Listener
	tr transport
}

func (l *wireListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &wireConn{Conn: c, tr: l.tr}, nil
}

type wireConn struct {
	net.Conn
	tr transport
}

// plainErrorHeaders ends the header of each refusal net/http writes
// itself (its server.go's errorHeaders). Our own replies are JSON, whose
// bodies hold no raw CR or LF, so no write of ours carries it.
var plainErrorHeaders = []byte("\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n")

// Each refusal is one short write; a reply of ours starts no write with
// a 417, which the handler never answers.
var (
	http11          = []byte("HTTP/1.1 ")
	expectationFail = []byte("HTTP/1.1 417 ")
)

const maxServerRefusal = 1 << 10

// serverRefusal reports whether p is a refusal net/http wrote itself,
// and what it said.
func serverRefusal(p []byte) (string, bool) {
	if len(p) > maxServerRefusal || !bytes.HasPrefix(p, http11) {
		return "", false
	}
	if bytes.HasPrefix(p, expectationFail) {
		return "417 Expectation Failed: the only Expect understood is 100-continue", true
	}
	if _, said, ok := bytes.Cut(p, plainErrorHeaders); ok {
		return string(said), true
	}
	return "", false
}

func (c *wireConn) Write(p []byte) (int, error) {
	said, ok := serverRefusal(p)
	if !ok {
		return c.Conn.Write(p)
	}
	status, e := http.StatusBadRequest, wireError{Code: codeBadRequest, Message: "the request could not be read: " + said}
	if c.tr == overToken {
		status, e = http.StatusUnauthorized, wireError{Code: codeUnauthorized}
	}
	if _, err := c.Conn.Write(jsonReply(status, e)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Read answers a client that sent plain HTTP to the https address, as
// net/http does for a *tls.Conn it sees (this wrapper hides it), in the
// wire's shape and in plain text, the only one that client reads.
func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	var re tls.RecordHeaderError
	if err != nil && errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
		_, _ = re.Conn.Write(jsonReply(http.StatusBadRequest, wireError{Code: codeBadRequest, Message: "this address speaks https; send the request over TLS"}))
		_ = re.Conn.Close()
	}
	return n, err
}

// looksLikeHTTP is net/http's test of a first TLS record that is plain
// HTTP instead.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}

// jsonReply is a whole response that closes its connection, as the
// refusals it replaces do.
func jsonReply(status int, e wireError) []byte {
	body := mustJSON(e)
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

// CloseWrite is the underlying connection's, where it has one: net/http
// half-closes before it hangs up on a header past its bound.
func (c *wireConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// SyscallConn is the underlying connection's: a socket caller's pid is
// read through it (peerPID).
func (c *wireConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}
