package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// DefaultMaxConnections is docs/spec.md §3's rpc.max_local_connections default.
const DefaultMaxConnections = 512

// Peer identifies the process at the other end of a local connection, from
// SO_PEERCRED. Each field is -1 when unavailable (not a Unix socket, not
// Linux).
type Peer struct {
	PID, UID, GID int32
}

// Server accepts connections and runs a Conn for each. Set its fields
// before Serve; they are read when Serve starts.
type Server struct {
	// Options apply to every connection. Options.Logger, when set, also
	// receives the server's own logs; each connection logs with fields
	// conn (a counter), peer_pid and peer_uid added. Options.FrameBudget is
	// shared by all connections; when nil, the server makes one of
	// DefaultMaxBufferedFrameBytes (128 MiB) at its first Serve; likewise
	// Options.OutputBudget, of DefaultMaxBufferedOutputBytes (256 MiB).
	Options Options
	// MaxConnections is the ceiling on open connections (default 512).
	// Over it, a new connection gets one -32004, id null,
	// data {"reason":"connection_limit","limit":N}, and is closed. One
	// warning is logged when refusing starts, and again only after a
	// connection has been admitted since.
	MaxConnections int
	// NewHandler returns the handler of a newly accepted connection, before
	// it reads anything. Nil answers every request with -32601.
	NewHandler func(c *Conn, peer Peer) Handler
	// OnConnect, when set, is called for every admitted connection before
	// it reads anything.
	OnConnect func(c *Conn, peer Peer)
	// OnDisconnect, when set, is called after the connection has closed and
	// all its handlers have returned, with Run's result. The connection no
	// longer counts against MaxConnections by then.
	OnDisconnect func(c *Conn, peer Peer, err error)

	mu        sync.Mutex
	budget    *FrameBudget  // shared by the connections when Options has none
	outBudget *OutputBudget // likewise
	workers   *workers      // run the connections' handlers
	conns     map[*Conn]struct{}
	listeners map[*net.Listener]struct{} // by address: a listener need not be comparable
	active    int
	refusing  bool
	shutdown  bool
	wg        sync.WaitGroup // every connection goroutine, refused ones too
	nextConn  atomic.Uint64
}

func (s *Server) logger() *zap.Logger {
	if s.Options.Logger == nil {
		return zap.NewNop()
	}
	return s.Options.Logger
}

// Serve accepts connections on ln until ctx is done, Shutdown is called, or
// ln fails. When ctx is done, every connection of this Serve is closed and
// Serve returns nil once they all have; after Shutdown it returns nil at
// once (Shutdown does the waiting); otherwise it returns the Accept error.
// Serve closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	limit := s.MaxConnections
	if limit <= 0 {
		limit = DefaultMaxConnections
	}
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	if s.listeners == nil {
		s.listeners = make(map[*net.Listener]struct{})
		s.conns = make(map[*Conn]struct{})
	}
	if s.workers == nil {
		s.workers = newWorkers(maxIdleWorkers, workerIdleFor)
	}
	if s.budget == nil {
		s.budget = s.Options.FrameBudget
		if s.budget == nil {
			s.budget = NewFrameBudget(DefaultMaxBufferedFrameBytes)
		}
	}
	if s.outBudget == nil {
		s.outBudget = s.Options.OutputBudget
		if s.outBudget == nil {
			s.outBudget = NewOutputBudget(DefaultMaxBufferedOutputBytes)
		}
	}
	s.listeners[&ln] = struct{}{}
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, &ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()

	var mine sync.WaitGroup
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			down := s.shutdown
			s.mu.Unlock()
			switch {
			case ctx.Err() != nil:
				mine.Wait() // their Run ctx is ctx: they are closing
				return nil
			case down:
				return nil
			case isTemporary(err):
				// Out of descriptors and the like: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger().Warn("accept failed; retrying", zap.Error(err), zap.Duration("backoff", backoff))
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
				}
				continue
			}
			return err
		}
		backoff = 0
		admitted, down := s.admit(limit)
		switch {
		case down:
			_ = nc.Close()
			return nil
		case !admitted:
			go s.refuse(nc, limit)
			continue
		}
		mine.Add(1)
		go func() {
			defer mine.Done()
			s.serveConn(ctx, nc)
		}()
	}
}

func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary() && !errors.Is(err, net.ErrClosed)
}

// admit counts a new connection against limit. Unless the server is
// shutting down, it adds the connection's goroutine to s.wg (under s.mu,
// so never after Shutdown has started waiting).
func (s *Server) admit(limit int) (admitted, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return false, true
	}
	s.wg.Add(1)
	if s.active >= limit {
		if !s.refusing {
			s.refusing = true
			s.logger().Warn("refusing connections: limit reached", zap.Int("limit", limit))
		}
		return false, false
	}
	if s.refusing {
		s.refusing = false
		s.logger().Info("accepting connections again", zap.Int("limit", limit))
	}
	s.active++
	return true, false
}

// refuse answers a connection over the ceiling and closes it, without
// reading from it.
func (s *Server) refuse(nc net.Conn, limit int) {
	defer s.wg.Done()
	r := &Response{Error: NewError(CodeConnectionLimit, "Connection limit reached",
		json.RawMessage(`{"reason":"connection_limit","limit":`+strconv.Itoa(limit)+`}`))}
	b, _ := appendResponse(nil, r)
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = nc.Write(append(b, '\n'))
	_ = nc.Close()
}

func (s *Server) serveConn(ctx context.Context, nc net.Conn) {
	defer s.wg.Done()
	peer := PeerOf(nc)
	opts := s.Options
	s.mu.Lock()
	opts.FrameBudget = s.budget
	opts.OutputBudget = s.outBudget
	workers := s.workers
	s.mu.Unlock()
	opts.Logger = s.logger().With(zap.Uint64("conn", s.nextConn.Add(1)),
		zap.Int32("peer_pid", peer.PID), zap.Int32("peer_uid", peer.UID))
	c := NewConn(nc, nil, opts)
	c.workers = workers
	c.h = notFoundHandler
	if s.NewHandler != nil {
		if h := s.NewHandler(c, peer); h != nil {
			c.h = h
		}
	}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	down := s.shutdown
	s.mu.Unlock()
	if down {
		c.drain(ErrShutdown)
	}
	if s.OnConnect != nil {
		s.OnConnect(c, peer)
	}
	err := c.Run(ctx)
	// The slot frees before the clean-up runs: the peer has seen its
	// connection end and may connect again at once.
	s.mu.Lock()
	delete(s.conns, c)
	s.active--
	s.mu.Unlock()
	if s.OnDisconnect != nil {
		s.OnDisconnect(c, peer, err)
	}
}

var notFoundHandler = HandlerFunc(func(_ context.Context, _ *Conn, req *Request) (any, error) {
	return nil, MethodNotFound(req.Method)
})

// Shutdown stops accepting, lets every connection finish the requests it
// has in flight (new requests are refused with -32603 "Server is shutting
// down"; responses to outgoing calls are still read) and closes each one
// once its answers are written. When ctx ends first, the remaining
// connections are closed at once (their handlers' contexts cancelled) and
// Shutdown returns ctx's error once their goroutines have returned. Safe to
// call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown = true
	for ln := range s.listeners {
		_ = (*ln).Close()
	}
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.drain(ErrShutdown)
	}

	idle := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
		s.stopWorkers()
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	conns = conns[:0]
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.closeWith(ErrShutdown)
	}
	<-idle
	s.stopWorkers()
	return ctx.Err()
}

// stopWorkers ends the handler workers once no connection is left.
func (s *Server) stopWorkers() {
	s.mu.Lock()
	w := s.workers
	s.mu.Unlock()
	if w != nil {
		w.close()
	}
}
