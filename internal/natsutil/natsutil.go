// Package natsutil connects to NATS and runs an embedded nats-server when
// no NATS_URL is given.
package natsutil

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// Connect opens a connection named after the process that keeps
// reconnecting for as long as the process lives.
func Connect(url, name string, log *zap.Logger) (*nats.Conn, error) {
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(200*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats reconnected") }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats async error", zap.String("subject", subject), zap.Error(err))
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", url, err)
	}
	return nc, nil
}

// ErrNotReady means the embedded server did not start accepting in time.
var ErrNotReady = errors.New("embedded nats-server not ready")

// Embedded is an in-process nats-server on loopback.
type Embedded struct {
	srv *server.Server
}

// RunEmbedded starts a nats-server on 127.0.0.1 at a random free port.
func RunEmbedded(log *zap.Logger) (*Embedded, error) {
	opts := &server.Options{
		Host:                  "127.0.0.1",
		Port:                  server.RANDOM_PORT,
		NoLog:                 true,
		NoSigs:                true,
		MaxPayload:            8 << 20,
		MaxPending:            64 << 20,
		WriteDeadline:         10 * time.Second,
		DisableShortFirstPing: true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, ErrNotReady
	}
	log.Info("embedded nats-server started", zap.String("url", srv.ClientURL()))
	return &Embedded{srv: srv}, nil
}

// URL is the client URL of the server.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
