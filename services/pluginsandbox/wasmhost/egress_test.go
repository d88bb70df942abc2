package wasmhost_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// A plugin granted http_client reaches public addresses only: loopback,
// private, link-local (the cloud's metadata service at 169.254.169.254),
// shared and unspecified addresses are refused before a connection is
// opened, also behind a redirect or a name, unless
// plugins.http.allowed_networks lists the network.
func TestHTTPImportRefusesAddressesThatAreNotPublic(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "internal")
	}))
	t.Cleanup(srv.Close)
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	// A public-looking server that redirects inside.
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, srv.URL, http.StatusFound)
	}))
	t.Cleanup(redirect.Close)

	none := func(c *wasmhost.Config) { c.HTTP.AllowedNetworks = nil }
	h := newHost(t, wasmhost.Limits{}, none)
	fetch := loadTool(t, h, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	for _, u := range []string{
		srv.URL,
		"http://localhost:" + port,
		"http://[::ffff:127.0.0.1]:" + port,
		"http://0.0.0.0:" + port,
		"http://169.254.169.254/latest/meta-data/",
		"http://10.0.0.1/",
		"http://100.100.100.200/",
		"http://[fd00::1]/",
		"http://[fe80::1]/",
	} {
		res, err := fetch.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": u})})
		if err != nil || res.Success || res.Error == nil || !strings.Contains(*res.Error, "access-denied") {
			t.Errorf("%s: %+v, %v; want access-denied", u, res, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback server was reached %d times", n)
	}

	// Allowed by the operator: the same server answers, and a redirect is
	// checked at each hop (here the redirect's server is allowed too).
	h2 := newHost(t, wasmhost.Limits{}, func(c *wasmhost.Config) {
		c.HTTP.AllowedNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	fetch2 := loadTool(t, h2, "httpfetch", func(s *wasmhost.PluginSpec) { s.Grants.HTTPClient = true })
	res, err := fetch2.Execute(context.Background(), wasmhost.ToolCall{Args: args(map[string]string{"url": redirect.URL})})
	if err != nil || !res.Success || res.Output != "200 internal" {
		t.Fatalf("allowed: %+v, %v", res, err)
	}
}
