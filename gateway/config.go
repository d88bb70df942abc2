// Package gateway is the edge: it terminates the local socket, holds each
// connection's state (handshake, principal, pending requests) and turns
// frames into gRPC calls to the services.
package gateway

import (
	"errors"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/nats-io/nats.go"
)

// Config is the gateway's process configuration (flags, environment).
type Config struct {
	// DataDir is reported as config_dir; Socket is the client socket.
	DataDir string
	Socket  string
	// Listener, when set, is the client socket already listening (the
	// launcher's, passed down so it outlives this process); else New
	// listens on Socket.
	Listener net.Listener
	// Service addresses. Plugin may list several replicas.
	ConfigAddr, SessionAddr, UploadAddr, DurableAddr string
	PluginAddrs                                      []string
	// NATS is the gateway's bus connection (role gateway).
	NATS *nats.Conn
	// Reason, when set, says why this process is not serving ("" while
	// it is), as its own gRPC health says it: its bus link is down (it
	// cannot deliver session updates), or it is shutting down. health and
	// status report it as the component SelfName beside the services.
	Reason func() string
	// Ephemeral exits the gateway (and so the stack) 1 s after the last
	// client leaves; never before the first client came.
	Ephemeral      bool
	EphemeralGrace time.Duration
	// Drain bounds in-flight requests at shutdown.
	Drain time.Duration
	// Dormant names the services the launcher starts only when a client
	// of theirs connects (the durable bridge, upload-staging): while its
	// marker (datadir.Dormant) is in DataDir a service shows as
	// "dormant", not unreachable, and is not called for its health (a
	// connection to its socket would wake it).
	Dormant []string
	Log     *zap.Logger
}

func (c *Config) validate() error {
	if c.Socket == "" || c.ConfigAddr == "" || c.SessionAddr == "" || c.NATS == nil {
		return errors.New("gateway: socket, config and session addresses and a NATS connection are required")
	}
	if c.EphemeralGrace <= 0 {
		c.EphemeralGrace = time.Second
	}
	if c.Drain <= 0 {
		c.Drain = 10 * time.Second
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	return nil
}
