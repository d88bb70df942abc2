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
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
)

// The private socket's path is refused at start when it is not private,
// with a message naming the part that failed; Collie's own check agrees.
func TestSocketPrivacy(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	good := mk("good", 0o700)
	if err := os.Symlink(good, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	open := mk("open", 0o777)
	sticky := mk("sticky", 0o777|os.ModeSticky)
	mk("sticky/inner", 0o700)
	group := mk("group", 0o770)
	mk("open/inner", 0o700)
	if err := os.WriteFile(filepath.Join(good, "file.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		path, part string
	}{
		{"relative/durable.sock", "absolute"},
		{"/" + strings.Repeat("x", 110) + "/d.sock", "at most 103"},
		{filepath.Join(base, "link", "durable.sock"), filepath.Join(base, "link") + " is a symbolic link"},
		{filepath.Join(group, "durable.sock"), "has mode 0770; it must be 0700"},
		{filepath.Join(open, "inner", "durable.sock"), open + " is writable by group or others"},
		{filepath.Join(good, "file.sock"), "not a socket"},
	}
	for _, c := range cases {
		ln, err := ListenSocket(c.path)
		if err == nil {
			ln.Close()
			t.Fatalf("%s was accepted", c.path)
		}
		if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), c.part) {
			t.Fatalf("%s: %v (want %q)", c.path, err, c.part)
		}
	}

	// A sticky world-writable folder above (as /tmp) is fine; a missing
	// socket folder is created 0700; a stale socket is replaced; the
	// socket is 0600.
	for _, path := range []string{filepath.Join(sticky, "inner", "d.sock"), filepath.Join(good, "new", "d.sock")} {
		ln, err := ListenSocket(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		ln, err = ListenSocket(path)
		if err != nil {
			t.Fatalf("%s with a stale socket: %v", path, err)
		}
		fi, _ := os.Stat(path)
		di, _ := os.Stat(filepath.Dir(path))
		if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
			t.Fatalf("modes %v %v", fi.Mode(), di.Mode())
		}
		if err := collietest.CheckSocketPath(path); err != nil {
			t.Fatalf("Collie refuses %s: %v", path, err)
		}
		ln.Close()
	}
	if err := collietest.CheckSocketPath(filepath.Join(base, "link", "d.sock")); !errors.Is(err, collietest.ErrNotPrivate) {
		t.Fatalf("Collie through a link: %v", err)
	}
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

	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	ln, prefix, err := listenToken("https://127.0.0.1:0/agent", cert, key)
	if err != nil {
		t.Fatal(err)
	}
	w.serve(t, ln, overToken, prefix)
	pool := x509.NewCertPool()
	certPEM, _ := os.ReadFile(cert)
	pool.AppendCertsFromPEM(certPEM)
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
