// Package natsutil connects a process to NATS under its bus identity and
// reports the connection's state, so health can say when the bus is
// unreachable.
package natsutil

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
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

// Liveness bounds of a connection. nats.go's defaults (a write may take a
// minute; a silent server is noticed after two pings two minutes apart)
// would let a server that stops reading hold every publish, which writes
// under the connection's lock, for a minute at a time while health still
// says serving.
const (
	// WriteTimeout bounds one write to the server (nats.FlusherTimeout):
	// a publish that has to write waits no longer than this.
	WriteTimeout = 2 * time.Second
	// PingInterval and MaxPingsOut: a server that answers no ping for
	// about three intervals is taken for gone and reconnected to.
	PingInterval = 5 * time.Second
	MaxPingsOut  = 2
)

// Reconnect backoff. A fixed wait of 200 ms had every process of the
// stack (of every stack on the host sharing an external server) try a
// server that is down five times a second each for as long as it stayed
// down; a server coming back met them all in step.
const (
	// FirstReconnectWait is the most the first attempt of an outage
	// waits: a blip (a server restarted, a connection dropped) is mended
	// at once.
	FirstReconnectWait = 200 * time.Millisecond
	// MaxReconnectWait bounds the wait between two attempts, and so how
	// long a process may stay off the bus once the server is back.
	MaxReconnectWait = 5 * time.Second
)

// reconnectDelay is the wait before reconnect attempt n of an outage (1
// for the first; nats.go counts afresh each time the connection drops):
// a bound that doubles from FirstReconnectWait up to MaxReconnectWait,
// less a random part of up to half of it, so that processes that lost
// the server together do not come back together.
func reconnectDelay(n int) time.Duration {
	bound := MaxReconnectWait
	if n < 1 {
		n = 1
	}
	// Past 2^5 times the first wait the bound is the cap: no shift that
	// could overflow.
	if n <= 6 {
		bound = min(bound, FirstReconnectWait<<(n-1))
	}
	return bound - rand.N(bound/2+1)
}

// watched holds the state callback of each connection Connect made, by
// connection, for Publish to report a failed write through.
var watched sync.Map // *nats.Conn → func(error)

// Connect opens a connection that keeps reconnecting for as long as the
// process lives, backing off (reconnectDelay) while the server stays
// away. The first connection is waited for (retrying) only up to
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
	// Why the stall check reconnected: nats.go tells the disconnect it
	// makes no error of its own, and "disconnected" said nothing.
	var stalledWhy atomic.Pointer[error]
	// Closed with the connection: the stall check ends with it, at once
	// rather than at its next tick.
	closed := make(chan struct{})
	var closeOnce sync.Once
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.FlusherTimeout(WriteTimeout),
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		// A write the flusher goroutine fails (the server stopped
		// reading) reconnects instead of leaving the connection stuck.
		nats.ReconnectOnFlusherError(),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				err = errors.New("disconnected")
				if why := stalledWhy.Swap(nil); why != nil {
					err = *why
				}
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
			closeOnce.Do(func() { close(closed) })
			watched.Delete(nc)
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
	watched.Store(nc, func(err error) {
		o.Log.Warn("nats write failed, reconnecting", zap.Error(err))
		state(fmt.Errorf("bus write failed: %w", err))
	})
	if !nc.IsConnected() {
		state(errors.New("bus not connected yet"))
	}
	go watchStall(nc, closed, func(err error) {
		err = fmt.Errorf("server not answering: %w", err)
		stalledWhy.Store(&err)
		o.Log.Warn("nats server not answering, reconnecting", zap.Error(err))
		state(fmt.Errorf("bus %w", err))
	})
	return nc, nil
}

// Stall check. nats.go's own pings (PingInterval, MaxPingsOut) take a
// server that hangs (SIGSTOP, a frozen host) for gone only after 10 to
// 15 s, and every call that waits on the bus meanwhile waits its whole
// deadline (a subscription's flush, 10 s). Shorter pings would not do:
// a pong comes behind everything the server has queued for the client,
// and a busy client reading seconds behind would be cut off, its
// subscriptions' messages lost. The check asks the server for a pong
// every StallCheckEvery and takes it for hung only when the pong has not
// come within StallTimeout and nothing at all came from it meanwhile: a
// server that sends is alive, however far behind.
const (
	StallCheckEvery = 2 * time.Second
	StallTimeout    = 3 * time.Second
)

// watchStall runs the stall check on nc until it is closed: a server
// seen hung is reported through stalled, and nc reconnects, which fails
// the flushes and requests waiting on it at once (nats.go clears them)
// and has the calls that check the link refused until it is back.
func watchStall(nc *nats.Conn, closed <-chan struct{}, stalled func(error)) {
	t := time.NewTicker(StallCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-closed:
			return
		case <-t.C:
		}
		if nc.IsClosed() {
			return
		}
		if !nc.IsConnected() {
			continue
		}
		in := nc.Stats().InBytes
		err := nc.FlushTimeout(StallTimeout)
		if !errors.Is(err, nats.ErrTimeout) || nc.Stats().InBytes != in || !nc.IsConnected() {
			continue
		}
		stalled(fmt.Errorf("no answer to a ping within %v", StallTimeout))
		_ = nc.ForceReconnect()
	}
}

// Publish publishes data on subject through nc. A publish that fails to
// write to the server (a write error, or a write that took longer than
// WriteTimeout: the server stopped reading) reports the bus down through
// the OnState of nc's Connect and starts a reconnect, so that the
// publishes after it are buffered for the new connection instead of each
// waiting on the stalled one; OnState is told when the bus is up again.
func Publish(nc *nats.Conn, subject string, data []byte) error {
	err := nc.Publish(subject, data)
	if err != nil {
		WriteFailed(nc, err)
	}
	return err
}

// WriteFailed handles err, returned by an operation of nc that writes
// to the server: when it is a failed write (not, say, a message over the
// size bound or a closed connection), the bus is reported down through
// the OnState of nc's Connect (nc made there) and a reconnect is started.
// It reports whether err was a failed write; a nil err is none.
func WriteFailed(nc *nats.Conn, err error) bool {
	if err == nil {
		return false
	}
	// A socket's write fails with a *net.OpError (a deadline passed, a
	// reset, a connection nats.go closed after a partial write); not a
	// net.Error: a context's deadline is one too, and is no write's.
	var oe *net.OpError
	if !errors.As(err, &oe) && !errors.Is(err, net.ErrClosed) {
		return false
	}
	if report, ok := watched.Load(nc); ok {
		report.(func(error))(err)
	}
	// A connection already reconnecting just tries again at once; a
	// closed one has nothing to reconnect (its ClosedHandler reported it).
	_ = nc.ForceReconnect()
	return true
}
