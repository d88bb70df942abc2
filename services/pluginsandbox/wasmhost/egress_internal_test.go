package wasmhost

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
)

func TestDestinationAllowed(t *testing.T) {
	lan := []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"93.184.215.14", true},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", true},
		{"127.0.0.1", false},
		{"::1", false},
		{"::ffff:127.0.0.1", false},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"::", false},
		{"169.254.169.254", false},
		{"fe80::1", false},
		{"fd00:ec2::254", false},
		{"10.1.2.3", false},
		{"172.16.0.1", false},
		{"192.168.0.1", false},
		{"192.168.1.20", true}, // listed
		{"::ffff:192.168.1.20", true},
		{"100.100.100.200", false},
		{"224.0.0.1", false},
		{"255.255.255.255", false},
		{"64:ff9b::a9fe:a9fe", false}, // 169.254.169.254 through NAT64
		{"fec0::1", false},
	} {
		if got := destinationAllowed(netip.MustParseAddr(c.addr), lan); got != c.want {
			t.Errorf("%s: allowed = %v, want %v", c.addr, got, c.want)
		}
	}
}

// The address check is a dialer of the transport's own, and a transport
// with its own dialer (or TLS settings) speaks HTTP/2 only when forced:
// the plugins' client kept HTTP/1.1 alone once the check was added.
func TestGuardedClientSpeaksHTTP2(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Proto)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := newHTTPClient([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")})
	tr := c.Transport.(*http.Transport)
	tr.TLSClientConfig = &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 || string(body) != "HTTP/2.0" {
		t.Fatalf("the plugins' client spoke %s (server saw %s), want HTTP/2", resp.Proto, body)
	}
}
