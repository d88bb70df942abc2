// Package natsutil connects a process to NATS under its bus identity and
// reports the connection's state, so health can say when the bus is
// unreachable.
package natsutil

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"
)

// Options of a connection.
type Options struct {
	URL  string
	Name string
	// Seed is the identity's nkey seed; nil connects anonymously, which
	// only a test's unauthenticated server accepts.
	Seed []byte
	// InboxPrefix is the prefix of the connection's reply subjects, the
	// one its bus permissions allow it to subscribe.
	InboxPrefix string
	Log         *zap.Logger
	// OnState is called with nil when the connection is (again) up and
	// with the reason when it is down; OnClosed once when it is closed for
	// good (the process should stop, so its supervisor restarts it).
	OnState  func(err error)
	OnClosed func(err error)
}

// ErrClosed reports a connection closed for good.
var ErrClosed = errors.New("nats connection closed")

// Connect opens a connection that keeps reconnecting for as long as the
// process lives. The first connection is waited for (retrying) only up to
// the server's refusal: bad credentials fail at once.
func Connect(o Options) (*nats.Conn, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	state := func(err error) {
		if o.OnState != nil {
			o.OnState(err)
		}
	}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(200 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				err = errors.New("disconnected")
			}
			o.Log.Warn("nats disconnected", zap.Error(err))
			state(fmt.Errorf("bus disconnected: %w", err))
		}),
		nats.ConnectHandler(func(*nats.Conn) { state(nil) }),
		nats.ReconnectHandler(func(*nats.Conn) {
			o.Log.Info("nats reconnected")
			state(nil)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			err := nc.LastError()
			if err == nil {
				err = ErrClosed
			}
			state(fmt.Errorf("bus connection closed: %w", err))
			if o.OnClosed != nil {
				o.OnClosed(err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			o.Log.Warn("nats async error", zap.String("subject", subject), zap.Error(err))
		}),
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.Seed != nil {
		kp, err := nkeys.FromSeed(o.Seed)
		if err != nil {
			return nil, fmt.Errorf("nats credential: %w", err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("nats credential: %w", err)
		}
		auth := nats.Nkey(pub, kp.Sign)
		// A server that authenticates nobody (a developer's own NATS_URL)
		// sends no nonce to sign: the credential would add nothing there,
		// and nats.go refuses to connect with it.
		probe, err := nats.Connect(o.URL, nats.Name(o.Name), auth, nats.Timeout(2*time.Second))
		switch {
		case errors.Is(err, nats.ErrNkeysNotSupported):
			o.Log.Warn("the bus server authenticates no one; connecting without a credential", zap.String("url", o.URL))
		case err == nil:
			probe.Close()
			opts = append(opts, auth)
		default:
			opts = append(opts, auth)
		}
	}
	nc, err := nats.Connect(o.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", o.URL, err)
	}
	if !nc.IsConnected() {
		state(errors.New("bus not connected yet"))
	}
	return nc, nil
}
