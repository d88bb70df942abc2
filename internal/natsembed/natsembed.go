// Package natsembed runs the embedded nats-server of a local stack: on
// loopback, refusing anonymous clients, each role of internal/bus allowed
// exactly the subjects of its permissions. Only the launcher (and tests)
// link the server.
package natsembed

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/bus"
)

// ErrNotReady means the server did not start accepting in time.
var ErrNotReady = errors.New("embedded nats-server not ready")

// Server is an in-process nats-server on loopback.
type Server struct {
	srv *server.Server
}

// Run starts a server on 127.0.0.1 at a random free port that admits the
// roles whose public keys are given, each with its bus permissions, and no
// one else.
func Run(keys map[bus.Role]string, log *zap.Logger) (*Server, error) {
	if len(keys) == 0 {
		return nil, errors.New("natsembed: no identities: the server would admit nobody")
	}
	opts := &server.Options{
		Host:                  "127.0.0.1",
		Port:                  server.RANDOM_PORT,
		NoLog:                 true,
		NoSigs:                true,
		MaxPayload:            bus.MaxPayload,
		MaxPending:            bus.MaxPending,
		WriteDeadline:         bus.WriteDeadline,
		DisableShortFirstPing: true,
		Nkeys:                 Users(keys),
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats-server: %w", err)
	}
	// Start returns once the listener is up (its accept loop runs on a
	// goroutine of its own), so the check below passes at its first look;
	// after a `go srv.Start()` it would most often sleep its 25 ms poll
	// interval, on every start of the stack.
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, ErrNotReady
	}
	log.Info("embedded nats-server started", zap.String("url", srv.ClientURL()))
	return &Server{srv: srv}, nil
}

// Users turns the role table into the server's nkey users.
func Users(keys map[bus.Role]string) []*server.NkeyUser {
	var users []*server.NkeyUser
	for _, r := range bus.Roles {
		pub, ok := keys[r]
		if !ok {
			continue
		}
		p := r.Permissions()
		perms := &server.Permissions{
			// An empty allow list with a deny-all makes "nothing" explicit:
			// a nil list would mean "everything".
			Publish:   &server.SubjectPermission{Allow: p.Publish, Deny: denyRest(p.Publish)},
			Subscribe: &server.SubjectPermission{Allow: p.Subscribe, Deny: denyRest(p.Subscribe)},
		}
		if p.Responses {
			perms.Response = &server.ResponsePermission{MaxMsgs: bus.ResponseMaxMsgs, Expires: bus.ResponseExpires}
		}
		users = append(users, &server.NkeyUser{Nkey: pub, Permissions: perms})
	}
	return users
}

// denyRest denies everything when nothing is allowed.
func denyRest(allow []string) []string {
	if len(allow) == 0 {
		return []string{">"}
	}
	return nil
}

// URL is the client URL of the server.
func (s *Server) URL() string { return s.srv.ClientURL() }

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown() {
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}
