package bus_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/natsembed"
)

// roleKeys creates every role's seed in a new data directory.
func roleKeys(t *testing.T) (string, map[bus.Role]string) {
	t.Helper()
	dir := t.TempDir()
	keys, err := bus.EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, keys
}

// parse renders the configuration and reads it back the way nats-server
// does when it starts with --config.
func parse(t *testing.T, keys map[bus.Role]string, addrs bus.ServerAddrs) *server.Options {
	t.Helper()
	raw, err := bus.ServerConfig(keys, addrs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered file: %v\n%s", err, raw)
	}
	return opts
}

// norm makes a nil and an empty subject list compare equal.
func norm(p *server.SubjectPermission) server.SubjectPermission {
	if p == nil {
		return server.SubjectPermission{}
	}
	out := server.SubjectPermission{}
	if len(p.Allow) > 0 {
		out.Allow = p.Allow
	}
	if len(p.Deny) > 0 {
		out.Deny = p.Deny
	}
	return out
}

// The file an external nats-server reads holds exactly the users, the
// permissions and the limits the embedded server of a local stack gets:
// one table, two forms.
func TestServerConfigIsTheEmbeddedServersTable(t *testing.T) {
	_, keys := roleKeys(t)
	opts := parse(t, keys, bus.ServerAddrs{Listen: "0.0.0.0:4222", Monitor: "127.0.0.1:8222"})

	if opts.Host != "0.0.0.0" || opts.Port != 4222 || opts.HTTPHost != "127.0.0.1" || opts.HTTPPort != 8222 {
		t.Errorf("addresses: %s:%d, monitor %s:%d", opts.Host, opts.Port, opts.HTTPHost, opts.HTTPPort)
	}
	if opts.MaxPayload != bus.MaxPayload || opts.MaxPending != bus.MaxPending || opts.WriteDeadline != bus.WriteDeadline {
		t.Errorf("limits: payload %d pending %d write deadline %v", opts.MaxPayload, opts.MaxPending, opts.WriteDeadline)
	}
	if len(opts.Users) != 0 || opts.NoAuthUser != "" || opts.Username != "" || opts.Authorization != "" {
		t.Errorf("another way in: users %v, no_auth_user %q, user %q, token set %v",
			opts.Users, opts.NoAuthUser, opts.Username, opts.Authorization != "")
	}
	want := natsembed.Users(keys)
	if len(opts.Nkeys) != len(want) || len(want) != len(bus.Roles) {
		t.Fatalf("%d nkey users in the file, %d embedded, %d roles", len(opts.Nkeys), len(want), len(bus.Roles))
	}
	got := map[string]*server.NkeyUser{}
	for _, u := range opts.Nkeys {
		got[u.Nkey] = u
	}
	for _, w := range want {
		g, ok := got[w.Nkey]
		if !ok {
			t.Errorf("user %s missing from the file", w.Nkey)
			continue
		}
		if g.Permissions == nil {
			t.Errorf("user %s has no permissions: it could do anything", w.Nkey)
			continue
		}
		if a, b := norm(g.Permissions.Publish), norm(w.Permissions.Publish); !reflect.DeepEqual(a, b) {
			t.Errorf("user %s publish: file %+v, embedded %+v", w.Nkey, a, b)
		}
		if a, b := norm(g.Permissions.Subscribe), norm(w.Permissions.Subscribe); !reflect.DeepEqual(a, b) {
			t.Errorf("user %s subscribe: file %+v, embedded %+v", w.Nkey, a, b)
		}
		if !reflect.DeepEqual(g.Permissions.Response, w.Permissions.Response) {
			t.Errorf("user %s responses: file %+v, embedded %+v", w.Nkey, g.Permissions.Response, w.Permissions.Response)
		}
	}
}

// A server started from the file admits the roles, refuses an anonymous
// client, and holds each role to its permissions.
func TestServerConfigEnforced(t *testing.T) {
	dir, keys := roleKeys(t)
	opts := parse(t, keys, bus.ServerAddrs{Listen: "127.0.0.1:4222"})
	opts.Port = server.RANDOM_PORT // the file's port may be taken here
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	url := srv.ClientURL()

	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("an anonymous client was admitted")
	}
	connect := func(r bus.Role) (*nats.Conn, chan error) {
		seedFile := bus.SeedFile(dir, r)
		opt, err := nats.NkeyOptionFromSeed(seedFile)
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 4)
		nc, err := nats.Connect(url, opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
		if err != nil {
			t.Fatalf("role %s refused: %v", r, err)
		}
		t.Cleanup(nc.Close)
		return nc, errs
	}
	gw, _ := connect(bus.RoleGateway)
	watch, err := gw.SubscribeSync(bus.SubjectConfigChanged)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg, _ := connect(bus.RoleConfig)
	if err := bus.PublishConfigChanged(cfg, 3, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := watch.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("the config role's announcement did not reach the gateway: %v", err)
	}
	// The sandbox publishes nothing: the server says so.
	sandbox, errs := connect(bus.RolePlugin)
	if err := bus.PublishConfigChanged(sandbox, 4, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	_ = sandbox.Flush()
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("sandbox publish: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sandbox's publish was not refused")
	}
	if msg, err := watch.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("the sandbox's announcement was delivered: %s", msg.Data)
	}
}

func TestServerConfigRefusesBadInput(t *testing.T) {
	_, keys := roleKeys(t)
	addrs := bus.ServerAddrs{Listen: "0.0.0.0:4222"}
	cases := map[string]func() (map[bus.Role]string, bus.ServerAddrs){
		"no keys": func() (map[bus.Role]string, bus.ServerAddrs) { return nil, addrs },
		"unknown role": func() (map[bus.Role]string, bus.ServerAddrs) {
			return map[bus.Role]string{"stranger": keys[bus.RoleConfig]}, addrs
		},
		"a seed instead of a public key": func() (map[bus.Role]string, bus.ServerAddrs) {
			return map[bus.Role]string{bus.RoleConfig: "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"}, addrs
		},
		"a quote in the key": func() (map[bus.Role]string, bus.ServerAddrs) {
			return map[bus.Role]string{bus.RoleConfig: keys[bus.RoleConfig] + `"`}, addrs
		},
		"no port": func() (map[bus.Role]string, bus.ServerAddrs) {
			return keys, bus.ServerAddrs{Listen: "0.0.0.0"}
		},
		"a quote in the monitor host": func() (map[bus.Role]string, bus.ServerAddrs) {
			return keys, bus.ServerAddrs{Listen: "0.0.0.0:4222", Monitor: `a"b:8222`}
		},
	}
	for name, c := range cases {
		k, a := c()
		if _, err := bus.ServerConfig(k, a); !errors.Is(err, bus.ErrServerConfig) {
			t.Errorf("%s: %v, want ErrServerConfig", name, err)
		}
	}
}
