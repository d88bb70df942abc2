package natsembed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/natsembed"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// stack is an embedded server with every role's credential.
type stack struct {
	t   *testing.T
	dir string
	srv *natsembed.Server
}

func start(t *testing.T) *stack {
	dir := t.TempDir()
	keys, err := bus.EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natsembed.Run(keys, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return &stack{t: t, dir: dir, srv: srv}
}

// as connects under role r; violations of its permissions land in errs.
func (s *stack) as(r bus.Role) (*nats.Conn, chan error) {
	s.t.Helper()
	seed, err := bus.LoadSeed(s.dir, r)
	if err != nil {
		s.t.Fatal(err)
	}
	errs := make(chan error, 16)
	nc, err := nats.Connect(s.srv.URL(), nkeyOption(s.t, seed), nats.CustomInboxPrefix(r.InboxPrefix()),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	if err != nil {
		s.t.Fatalf("connect as %s: %v", r, err)
	}
	s.t.Cleanup(nc.Close)
	return nc, errs
}

func nkeyOption(t *testing.T, seed []byte) nats.Option {
	opt, err := nats.NkeyOptionFromSeed(writeSeed(t, seed))
	if err != nil {
		t.Fatal(err)
	}
	return opt
}

func writeSeed(t *testing.T, seed []byte) string {
	path := t.TempDir() + "/seed.nk"
	if err := writeFile(path, seed); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestAnonymousAndStrangersRefused(t *testing.T) {
	s := start(t)
	if nc, err := nats.Connect(s.srv.URL()); err == nil {
		nc.Close()
		t.Fatal("an anonymous client was admitted")
	}
	// A key the stack did not generate.
	if nc, err := nats.Connect(s.srv.URL(), nkeyOption(t, mustSeed(t, t.TempDir()))); err == nil {
		nc.Close()
		t.Fatal("a stranger's key was admitted")
	}
	// The stack's own processes connect through natsutil.
	seed, err := bus.LoadSeed(s.dir, bus.RoleSession)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := natsutil.Connect(natsutil.Options{URL: s.srv.URL(), Name: "t", Seed: seed, InboxPrefix: bus.RoleSession.InboxPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("natsutil connection: %v", err)
	}
}

func mustSeed(t *testing.T, dir string) []byte {
	if _, err := bus.EnsureCredentials(dir); err != nil {
		t.Fatal(err)
	}
	seed, err := bus.LoadSeed(dir, bus.RoleSession)
	if err != nil {
		t.Fatal(err)
	}
	return seed
}

// received reports whether sub gets a message within d.
func received(sub *nats.Subscription, d time.Duration) bool {
	_, err := sub.NextMsg(d)
	return err == nil
}

func TestEachRoleOnlyWhatItOwns(t *testing.T) {
	s := start(t)
	gw, _ := s.as(bus.RoleGateway)
	watch, err := gw.SubscribeSync(bus.SubjectConfigChanged)
	if err != nil {
		t.Fatal(err)
	}
	updates, err := gw.SubscribeSync(bus.SubjectAllSessionUpdates)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Flush(); err != nil {
		t.Fatal(err)
	}

	// The config service announces config changes; the session service and
	// the gateway cannot.
	cfg, _ := s.as(bus.RoleConfig)
	if err := bus.PublishConfigChanged(cfg, 7, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	if !received(watch, 5*time.Second) {
		t.Fatal("the config service's change did not arrive")
	}
	for _, r := range []bus.Role{bus.RoleSession, bus.RoleGateway, bus.RoleDurable, bus.RolePlugin, bus.RoleUpload, bus.RoleLauncher} {
		nc, errs := s.as(r)
		_ = bus.PublishConfigChanged(nc, 8, nil)
		_ = nc.Flush()
		if received(watch, 300*time.Millisecond) {
			t.Errorf("%s published a config change", r)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("%s: want a permission violation, got %v", r, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s: no permission violation reported", r)
		}
	}

	// Only the session service publishes session updates.
	sess, _ := s.as(bus.RoleSession)
	subject, _ := bus.SessionUpdateSubject("sess_1", 1)
	if err := sess.Publish(subject, []byte{}); err != nil {
		t.Fatal(err)
	}
	if !received(updates, 5*time.Second) {
		t.Fatal("the session service's update did not arrive")
	}
	for _, r := range []bus.Role{bus.RoleGateway, bus.RoleConfig, bus.RoleDurable, bus.RoleLauncher} {
		nc, _ := s.as(r)
		_ = nc.Publish(subject, []byte{})
		_ = nc.Flush()
		if received(updates, 300*time.Millisecond) {
			t.Errorf("%s published a session update", r)
		}
	}

	// Nobody but the gateway reads every conversation.
	for _, r := range []bus.Role{bus.RoleConfig, bus.RolePlugin, bus.RoleUpload, bus.RoleLauncher} {
		nc, errs := s.as(r)
		if _, err := nc.SubscribeSync(">"); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("%s subscribing >: %v", r, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s subscribed to > without a violation", r)
		}
	}
}

// The session service asks a connection through the gateway, which may
// answer (one reply per request) without publishing anything else.
func TestAsksAnsweredOnlyByTheGateway(t *testing.T) {
	s := start(t)
	gw, _ := s.as(bus.RoleGateway)
	if _, err := gw.Subscribe("clawmesh.gateway.conn.c1.ask", func(m *nats.Msg) { _ = m.Respond([]byte("yes")) }); err != nil {
		t.Fatal(err)
	}
	if err := gw.Flush(); err != nil {
		t.Fatal(err)
	}
	sess, _ := s.as(bus.RoleSession)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := sess.RequestWithContext(ctx, "clawmesh.gateway.conn.c1.ask", []byte("?"))
	if err != nil || string(msg.Data) != "yes" {
		t.Fatalf("ask: %v %v", msg, err)
	}
	// The config service may not ask a connection.
	cfg, _ := s.as(bus.RoleConfig)
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if _, err := cfg.RequestWithContext(ctx2, "clawmesh.gateway.conn.c1.ask", []byte("?")); err == nil {
		t.Fatal("the config service asked a connection")
	}
}
