// Package gateway is the edge: it terminates the local socket, holds each
// connection's state (handshake, principal, pending requests) and turns
// frames into gRPC calls to the services.
package gateway

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/version"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// Config is the gateway's process configuration (flags, environment).
type Config struct {
	// DataDir is reported as config_dir; Socket is the client socket.
	DataDir string
	Socket  string
	// HealthListen is the gateway's own gRPC health socket.
	HealthListen string
	// Service addresses. Plugin may list several replicas.
	ConfigAddr, SessionAddr, UploadAddr, DurableAddr string
	PluginAddrs                                      []string
	NATSURL                                          string
	// Ephemeral exits the gateway (and so the stack) 1 s after the last
	// client leaves; never before the first client came.
	Ephemeral      bool
	EphemeralGrace time.Duration
	// Drain bounds in-flight requests at shutdown.
	Drain time.Duration
	Log   *zap.Logger
}

func (c *Config) validate() error {
	if c.Socket == "" || c.ConfigAddr == "" || c.SessionAddr == "" || c.NATSURL == "" {
		return errors.New("gateway: socket, config, session and NATS addresses are required")
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

// limits are the edge settings read from the config document at listener
// start (rpc.*), with the documented defaults.
type limits struct {
	maxFrameBytes     int
	initializeTimeout time.Duration
	frameTimeout      time.Duration
	writeStallTimeout time.Duration
	maxConnections    int
	serverVersion     string
}

func defaultLimits() limits {
	return limits{
		maxFrameBytes:     jsonrpc.DefaultMaxFrameBytes,
		initializeTimeout: 30 * time.Second,
		frameTimeout:      30 * time.Second,
		writeStallTimeout: 30 * time.Second,
		maxConnections:    512,
		serverVersion:     version.Version,
	}
}

// limitsFrom reads rpc.* from the live config document.
func limitsFrom(live *configv1.LiveResponse) (limits, error) {
	l := defaultLimits()
	rpcv, ok := live.GetDocument().GetFields()["rpc"]
	if !ok {
		return l, nil
	}
	rpc := rpcv.GetStructValue().GetFields()
	positive := func(name string, set func(int64)) error {
		v, ok := rpc[name]
		if !ok {
			return nil
		}
		n := v.GetNumberValue()
		if n < 1 || n != float64(int64(n)) {
			return fmt.Errorf("rpc.%s must be a positive integer", name)
		}
		set(int64(n))
		return nil
	}
	ms := func(d *time.Duration) func(int64) { return func(n int64) { *d = time.Duration(n) * time.Millisecond } }
	for _, f := range []struct {
		name string
		set  func(int64)
	}{
		{"max_frame_bytes", func(n int64) { l.maxFrameBytes = int(n) }},
		{"initialize_timeout_ms", ms(&l.initializeTimeout)},
		{"frame_timeout_ms", ms(&l.frameTimeout)},
		{"write_stall_timeout_ms", ms(&l.writeStallTimeout)},
		{"max_local_connections", func(n int64) { l.maxConnections = int(n) }},
	} {
		if err := positive(f.name, f.set); err != nil {
			return l, err
		}
	}
	if v, ok := rpc["advertised_server_version"]; ok && v.GetStringValue() != "" {
		l.serverVersion = v.GetStringValue()
	}
	return l, nil
}
