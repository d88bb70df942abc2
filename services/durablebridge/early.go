package durablebridge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/handoff"
)

// Early answers on the private socket the launcher handed over while the
// bridge's start has yet to build the Bridge (it waits for its database,
// the bus, then the config service, however long config is away): hello with ready false, every
// other route 503 starting saying what the start waits for, by the same
// handler and in the same order of refusals as the bridge's own.
//
// Without it a client's connection waited in the socket's backlog for
// the whole start: Collie, which gives a hello 1000 ms, showed the agent
// unreachable with no reason while config was hung. The durable wire has
// an answer for an agent that is not ready yet, so it is given at once,
// not after a grace: Collie polls again within a second either way.
//
// Until config has answered the settings are unknown: a caller is not
// refused as a descendant here (durable.refuse_descendants), but nothing
// it can reach acts or reads a session.
type Early struct {
	b    *Bridge // a stand-in: its layout never ready, its epoch unrecorded
	h    *handoff.Listener
	srv  *http.Server
	done chan struct{} // closed when srv's Serve returned
	once sync.Once
}

// AnswerEarly begins answering on ln, a socket handed over by the
// launcher, and returns the listener the bridge serves on once started
// (Config.Socket): Stop hands the connections not yet accepted over to
// it, none lost and none accepted twice. Closing that listener closes
// ln.
func AnswerEarly(ln net.Listener, hostName, waitingOn string, log *zap.Logger) (*Early, net.Listener) {
	if log == nil {
		log = zap.NewNop()
	}
	e := &Early{
		b: &Bridge{cfg: Config{HostName: hostName, RefuseDescendants: func() bool { return false }}, log: log,
			layout: NewLayout(randomEpoch()), base: context.Background()},
		h:    handoff.New(ln),
		done: make(chan struct{}),
	}
	e.SetWaitingOn(waitingOn)
	e.srv = e.b.httpServer(overSocket, "")
	view := boundConns(e.h.View(false), socketConns)
	go func() {
		defer close(e.done)
		if err := serveWire(e.srv, view, overSocket); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			log.Warn("durable socket not answered while starting", zap.Error(err))
		}
	}()
	return e, e.h.View(true)
}

// SetWaitingOn sets what a refusal says the start waits for (health's
// reason: "waiting for the database", say; "" for nothing named).
func (e *Early) SetWaitingOn(what string) {
	msg := "the durable agent is starting"
	if what != "" {
		msg += ": " + what
	}
	e.b.startingMsg.Store(&msg)
}

// Stop stops answering and returns once the requests being answered
// ended; the connections it had are closed, so their clients connect
// again to the bridge. Its answers take microseconds, but a connection
// that has sent nothing yet counts as busy to Shutdown for 5 s: the
// bound keeps a silent client from holding the bridge's start that
// long. It may be called more than once.
func (e *Early) Stop() {
	e.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := e.srv.Shutdown(ctx); err != nil {
			e.srv.Close()
		}
		<-e.done
		e.b.handlers.Wait()
	})
}

// randomEpoch is the stand-in's epoch: new, as every start's, so a
// client takes the bridge's own for a new start.
func randomEpoch() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand does not fail on Linux
	return hex.EncodeToString(b)
}
