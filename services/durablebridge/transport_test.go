package durablebridge

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
)

// serveToken serves w's token transport on https://127.0.0.1:<port>/agent
// with a self-signed certificate, and returns its listener and the pool
// that trusts it.
func serveToken(t *testing.T, w *wireBridge) (net.Listener, *x509.CertPool) {
	t.Helper()
	cert, key := selfSigned(t, t.TempDir())
	ln, prefix, err := listenToken("https://127.0.0.1:0/agent", cert, key)
	if err != nil {
		t.Fatal(err)
	}
	w.serve(t, ln, overToken, prefix)
	pool := x509.NewCertPool()
	certPEM, _ := os.ReadFile(cert)
	pool.AppendCertsFromPEM(certPEM)
	return ln, pool
}

// Behind the token the token is checked first: without it, or with a
// wrong one, every call (hello too, a wrong version too) is a bare 401.
// The same bytes otherwise, but no allow_always.
func TestTokenTransport(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	w.addPane("p1", "default", 2, testAsk("p1", "tc_1"))
	const token = "0123456789abcdefghijklmnopqrstuvwxyz!#"
	w.b.SetToken(token)

	ln, pool := serveToken(t, w)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + ln.Addr().String() + "/agent"
	ctx := context.Background()

	for _, tok := range []string{"", "wrong-token-of-enough-length-0123456789", token + "x"} {
		c := collietest.URL(base, tok, hc)
		for _, hdr := range []http.Header{nil, v1(), {"X-Collie-Session": {"9"}}} {
			r := raw(t, c, http.MethodGet, "/hello", hdr, nil)
			if r.Status != http.StatusUnauthorized || string(r.Body) != `{"code":"unauthorized"}` {
				t.Fatalf("token %q: %s", tok, r)
			}
		}
		want(t, raw(t, c, http.MethodGet, "/nowhere", nil, nil), http.StatusUnauthorized, codeUnauthorized)
	}
	c := collietest.URL(base, token, hc)
	if h, err := c.SayHello(ctx); err != nil || !h.Ready || h.Epoch != testEpoch {
		t.Fatalf("hello with the token: %v %v", h, err)
	}
	if _, _, err := c.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	p := c.Snap.Pane("p1")
	if p == nil || len(p.Asks) != 1 {
		t.Fatalf("pane over the token %+v", p)
	}
	for _, o := range p.Asks[0].Options {
		if o.ID == optAllowAlways {
			t.Fatal("allow_always behind the token")
		}
	}
	// An unset token refuses everything.
	w.b.SetToken("")
	want(t, raw(t, c, http.MethodGet, "/hello", nil, nil), http.StatusUnauthorized, codeUnauthorized)

	// Plain http is for loopback only.
	if _, _, err := listenToken("http://0.0.0.0:0", "", ""); !errors.Is(err, ErrListenURL) {
		t.Fatalf("plain http off loopback: %v", err)
	}
	for _, bad := range []string{"https://u:p@127.0.0.1:0", "https://127.0.0.1:0/?q=1", "ftp://127.0.0.1:0", "https://127.0.0.1:0"} {
		if ln, _, err := listenToken(bad, "", ""); err == nil {
			ln.Close()
			t.Fatalf("%s accepted", bad)
		}
	}
}

// With durable.refuse_descendants, a socket caller that descends from the
// launcher is refused (here the caller is the test process itself).
func TestCallerRefused(t *testing.T) {
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	refuse := true
	w.b.cfg.RefuseDescendants = func() bool { return refuse }
	w.b.launcher = os.Getpid()
	c := w.collie(t)
	want(t, raw(t, c, http.MethodGet, "/hello", nil, nil), http.StatusForbidden, codeCallerRefused)
	w.b.launcher = 1 << 30 // no such process: nobody descends from it
	if r := raw(t, c, http.MethodGet, "/hello", nil, nil); r.Status != http.StatusOK {
		t.Fatalf("a caller outside the stack: %s", r)
	}
	if !descendsFrom(os.Getpid(), os.Getppid()) || descendsFrom(os.Getppid(), os.Getpid()) {
		t.Fatal("descendsFrom")
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "durable test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// The token transport faces the network, where anyone may connect before
// a token is read; its open connections are bounded, and a connection
// past the bound waits until one closes.
func TestTokenTransportBoundsConnections(t *testing.T) {
	defer func(n int) { tokenConns = n }(tokenConns)
	tokenConns = 3
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	const token = "0123456789abcdefghijklmnopqrstuvwxyz!#"
	w.b.SetToken(token)
	ln, pool := serveToken(t, w)
	hello := func(within time.Duration) error {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		c := collietest.URL("https://"+ln.Addr().String()+"/agent", token, hc)
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_, err := c.SayHello(ctx)
		return err
	}
	if err := hello(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Connections that send nothing, as many as the bound.
	var idle []net.Conn
	for range tokenConns {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, nc)
		defer nc.Close()
	}
	if err := hello(time.Second); err == nil {
		t.Fatal("a connection past the bound was served")
	}
	idle[0].Close()
	if err := hello(10 * time.Second); err != nil {
		t.Fatalf("once one closed: %v", err)
	}
}

// The private socket's open connections are bounded too: any process of
// the user may connect, the stack's own descendants among them (a tool
// the model runs), refused or not, and each connection held a goroutine
// and its buffers for as long as it lasted, as many as were opened. Past
// the bound a connection waits until one closes; the caller's pid is
// still read through the bound (caller-refused).
func TestSocketBoundsConnections(t *testing.T) {
	defer func(n int) { socketConns = n }(socketConns)
	socketConns = 3
	w := newWireBridge(t, false)
	w.b.layout.SetReady()
	hello := func(within time.Duration) error {
		c := w.collie(t)
		c.Timeouts.Read = within
		_, err := c.SayHello(context.Background())
		c.Close()
		return err
	}
	if err := hello(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	for range socketConns {
		nc, err := net.Dial("unix", w.socket)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, nc)
		defer nc.Close()
	}
	if err := hello(time.Second); err == nil {
		t.Fatal("a connection past the bound was served")
	}
	idle[0].Close()
	if err := hello(10 * time.Second); err != nil {
		t.Fatalf("once one closed: %v", err)
	}
	w.b.cfg.RefuseDescendants = func() bool { return true }
	w.b.launcher = os.Getpid()
	c := w.collie(t)
	want(t, raw(t, c, http.MethodGet, "/hello", nil, nil), http.StatusForbidden, codeCallerRefused)
}
