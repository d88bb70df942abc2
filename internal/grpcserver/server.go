// Package grpcserver is the gRPC server every Clawmesh service runs: health
// and reflection registered, panics recovered and logged, and a staged
// drain on shutdown.
package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/handoff"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/unixsock"
)

// streamWorkers is how many goroutines serve calls over and over, each
// keeping the stack it grew. grpc-go otherwise starts a goroutine per
// call, which grows its stack by copying through the depth of a handler
// (gRPC, pgx) every time: that was 13% of the session service's CPU
// under 64 clients of session/state and status. When every worker is
// busy a call gets a goroutine of its own as before, so the count bounds
// nothing; 16 covers the calls a 2-core host runs at once with room (2
// left stack growth at 9%, 16 at 2.7%). The idle stack's processes
// together held 0.5 to 1.6 MB more with them.
const streamWorkers = 16

// DefaultDrain bounds how long in-flight RPCs may run after shutdown
// starts before they are cut.
const DefaultDrain = 10 * time.Second

// Server wraps a grpc.Server with its health service.
//
// Health tells the truth: the process reports SERVING only once it
// registered its services (SetServing) and while every dependency it
// needs (SetDependency: its database, the bus) is reachable. While one is
// not, every name but Liveness reports NOT_SERVING and a Check answers
// with the reason in the trailer ReasonTrailer, which the gateway's status
// and health show and grpcurl prints.
type Server struct {
	GRPC   *grpc.Server
	Health *health.Server

	log      *zap.Logger
	drain    time.Duration
	stopOnce sync.Once

	classify func(error) error

	hmu      sync.Mutex
	names    []string         // set by SetServing; nil before
	deps     map[string]error // a dependency's last error, nil when fine
	starting string           // what the start waits for (SetStarting)
	waitsOn  bool             // starting is another process (SetWaitingOn)
	shutdown bool

	// early answers health on the listener while the process starts
	// (ServeEarly), until Serve takes the listener over.
	early     *grpc.Server
	earlyLis  *handoff.Listener
	earlyDone chan struct{} // closed when early's Serve returned
	earlyConn *connTracker  // early's connections, cut before its Stop
	earlyOver bool          // stopEarly ran: no start's server any more

	// conns are GRPC's connections (Serve), cut at the drain limit.
	conns *connTracker
}

// Liveness is the health name that answers SERVING from SetServing until
// shutdown whatever the dependencies say: the process runs and its server
// answers. It is what a liveness probe asks (deploy/k8s): the overall
// name is NOT_SERVING while the database or the bus is away, and a
// liveness probe on it restarted every process a minute into an outage
// of either, killing the turns and staged uploads they held, when each
// reconnects by itself (and one whose bus is closed for good exits).
const Liveness = "clawmesh.liveness"

// Calls is the health name that answers SERVING only while the process's
// own server (Serve) answers its calls, whatever its dependencies say,
// until shutdown. A client of several replicas routes calls only to the
// replicas that say so (grpcclient.DialReplicas): a replica still
// starting answers on its socket already (ServeEarly, AnswerEarly), and
// every call it got there failed Unavailable "starting: ..." while
// another replica served. The overall name does not do: it says SERVING
// from SetServing, while the start's server still answers until Serve
// takes the listener over, and NOT_SERVING while a dependency is away,
// when the process still answers its calls (a sandbox runs tools with
// its bus away).
const Calls = "clawmesh.calls"

// ReasonTrailer carries why a process is NOT_SERVING on a health Check.
const ReasonTrailer = "clawmesh-not-serving-reason"

// MaxMessageBytes bounds one message between the processes, either way
// (grpcclient's calls too): gRPC's default of 4 MiB is below a 10 MB
// stored file. What a service returns whole (the live config, a page of
// a transcript) is bounded well below it where it is made.
const MaxMessageBytes = 16 << 20

// New builds a server. drain is the hard limit of a graceful stop; zero
// means DefaultDrain.
func New(log *zap.Logger, drain time.Duration, opts ...grpc.ServerOption) *Server {
	if drain <= 0 {
		drain = DefaultDrain
	}
	s := &Server{log: log, drain: drain, Health: health.NewServer()}
	opts = append(opts,
		// Clients ping a connection with calls in flight after
		// grpcclient.KeepaliveTime of silence, to find a hung process:
		// allow it (the default refuses pings closer than 5 minutes).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second}),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.NumStreamWorkers(streamWorkers),
	)
	s.GRPC = grpc.NewServer(opts...)
	s.deps = map[string]error{}
	// health.NewServer starts the overall name SERVING: nothing serves
	// yet, and ServeEarly answers before SetServing.
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.Health.SetServingStatus(Liveness, healthpb.HealthCheckResponse_NOT_SERVING)
	s.Health.SetServingStatus(Calls, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.GRPC, &healthWithReason{Server: s.Health, s: s})
	reflection.Register(s.GRPC)
	return s
}

// SetStarting says what the process's start waits for (its database,
// say); health gives it as the reason until SetServing.
func (s *Server) SetStarting(what string) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.starting, s.waitsOn = what, false
	if s.names == nil && !s.shutdown {
		s.Health.SetServingStatus(Liveness, healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// SetWaitingOn is SetStarting for a wait on another process (the config
// service) that may last as long as that process is away: Liveness
// answers SERVING meanwhile, since this process is alive and restarting
// it mends nothing. A pod's startup probe asks Liveness (deploy/k8s) and
// restarted a service every 120 s for as long as config hung. The next
// SetStarting or SetServing ends it.
func (s *Server) SetWaitingOn(what string) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.starting, s.waitsOn = what, true
	if s.names == nil && !s.shutdown {
		s.Health.SetServingStatus(Liveness, healthpb.HealthCheckResponse_SERVING)
	}
}

// waitingOn is what the start waits for when that is another process
// (SetWaitingOn), else "".
func (s *Server) waitingOn() string {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if !s.waitsOn || s.names != nil || s.shutdown {
		return ""
	}
	return s.starting
}

// ServeEarly answers health on lis from now on, NOT_SERVING with the
// reason (SetStarting, SetDependency) until the process serves, and any
// other call with Unavailable: a process whose start hung (a database
// that accepts and never answers) answered nothing at all, and its
// probes and the gateway's status saw only timeouts, saying nothing of
// why. gRPC takes no service once it serves, hence a server of its own
// for the start. It returns the listener to give Serve, which takes the
// connections over from the start's server (those it held are closed;
// their clients connect again); Shutdown closes lis when Serve never
// ran.
func (s *Server) ServeEarly(lis net.Listener) net.Listener {
	lis = s.HoldEarly(lis)
	s.AnswerEarly()
	return lis
}

// HoldEarly is ServeEarly that does not answer yet: the connections
// wait (in lis's backlog) until the process serves, or until
// AnswerEarly. It is for a socket the launcher bound and handed over
// (listenfd), whose first calls are better served a moment later than
// refused now (a dormant process's waking call), unless the start waits
// on and on.
func (s *Server) HoldEarly(lis net.Listener) net.Listener {
	h := handoff.New(lis)
	s.hmu.Lock()
	s.earlyLis = h
	s.hmu.Unlock()
	return h.View(true)
}

// AnswerEarly begins answering on the listener HoldEarly took, as
// ServeEarly does; it does nothing once the process serves or shuts
// down, or when it answers already.
func (s *Server) AnswerEarly() {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.earlyLis == nil || s.early != nil || s.earlyOver {
		return
	}
	early := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		if waiting := s.waitingOn(); waiting != "" {
			// Named to the client (the gateway sends "session:
			// starting: waiting for the config service"): a bare
			// Unavailable read "session unavailable", as if the
			// process were down, when the one to mend is config.
			return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, "starting: "+waiting)
		}
		reason := s.Reason() // "starting: ..." until it serves
		if reason == "" {
			reason = "starting"
		}
		return status.Error(codes.Unavailable, reason)
	}))
	healthpb.RegisterHealthServer(early, &healthWithReason{Server: s.Health, s: s, early: true})
	// grpcurl asks reflection for a method's types before it calls: the
	// unknown-service handler failed that too, so grpcurl could ask
	// neither health nor anything else. It lists what answers now and
	// resolves every type the binary holds, and a call of a service not
	// yet served gets the handler's Unavailable with the reason.
	reflection.Register(early)
	done := make(chan struct{})
	view := trackConns(s.earlyLis.View(false))
	s.early, s.earlyDone, s.earlyConn = early, done, view
	go func() {
		defer close(done)
		_ = early.Serve(view)
	}()
}

// stopEarly stops the start's server, if any; none starts after it.
func (s *Server) stopEarly() {
	s.hmu.Lock()
	early, done, conns := s.early, s.earlyDone, s.earlyConn
	s.early, s.earlyOver = nil, true
	s.hmu.Unlock()
	if early != nil {
		// Cut first: Stop waits for a connection still in its
		// handshake, and a client that connected and sent nothing held
		// the process's Serve (the early server meanwhile answering
		// "starting" to every other client) for grpc's connection
		// timeout, 120 s. Stop closes the others anyway.
		conns.cut()
		early.Stop()
		<-done // its Serve has returned: no goroutine of the start is left
	}
}

// SetServing marks the overall health and each named service SERVING,
// unless a dependency is down.
func (s *Server) SetServing(services ...string) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.names = append([]string{""}, services...)
	s.applyLocked()
}

// SetDependency records the state of a dependency the process needs: err
// nil when it is reachable, else why not. Safe from any goroutine.
func (s *Server) SetDependency(name string, err error) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if prev, ok := s.deps[name]; ok && (prev == nil) == (err == nil) && (err == nil || prev.Error() == err.Error()) {
		return
	}
	s.deps[name] = err
	if err != nil {
		s.log.Warn("dependency unavailable", zap.String("dependency", name), zap.Error(err))
	} else {
		s.log.Info("dependency available", zap.String("dependency", name))
	}
	s.applyLocked()
}

// Reason is why the process is not serving ("" when it is, or before it
// registered).
func (s *Server) Reason() string {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	return s.reasonLocked()
}

func (s *Server) reasonLocked() string {
	if s.shutdown {
		return "shutting down"
	}
	var down []string
	for name, err := range s.deps {
		if err != nil {
			down = append(down, name+": "+err.Error())
		}
	}
	sort.Strings(down)
	if s.names == nil && s.starting != "" {
		down = append([]string{"starting: " + s.starting}, down...)
	}
	return strings.Join(down, "; ")
}

func (s *Server) applyLocked() {
	if s.names == nil || s.shutdown {
		return
	}
	st := healthpb.HealthCheckResponse_SERVING
	if s.reasonLocked() != "" {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	for _, name := range s.names {
		s.Health.SetServingStatus(name, st)
	}
	s.Health.SetServingStatus(Liveness, healthpb.HealthCheckResponse_SERVING)
}

// healthWithReason is the health service with the reason trailer.
type healthWithReason struct {
	*health.Server
	s *Server
	// early: the start's server's. Between SetServing and Serve's
	// taking the listener over it would answer SERVING from the shared
	// state while every other call it gets is refused "starting": a
	// readiness check (the launcher's, a client of one address) that
	// asked then sent its first calls to be refused. It says
	// NOT_SERVING until the process's own server answers, Liveness
	// aside (the process is alive).
	early bool
}

// startsServing is the reason the start's server gives once the process
// has registered its services and before its own server answers.
const startsServing = "starting: its server is taking the socket over"

func (h *healthWithReason) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	resp, err := h.Server.Check(ctx, req)
	if h.early && err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING && req.GetService() != Liveness {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(ReasonTrailer, startsServing))
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		if reason := h.s.Reason(); reason != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(ReasonTrailer, reason))
		}
	}
	return resp, err
}

// Serve serves lis until ctx is done, then drains. It returns nil after a
// shutdown caused by ctx, or the listener's error.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.stopEarly()
	conns := trackConns(lis)
	s.hmu.Lock()
	s.conns = conns
	// The start's server is gone (stopEarly): a connection from here on
	// is this server's, and a Shutdown since made this a no-op.
	s.Health.SetServingStatus(Calls, healthpb.HealthCheckResponse_SERVING)
	s.hmu.Unlock()
	errc := make(chan error, 1)
	go func() { errc <- s.GRPC.Serve(conns) }()
	select {
	case err := <-errc:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	case <-ctx.Done():
		s.Shutdown()
		<-errc
		return nil
	}
}

// Shutdown reports NOT_SERVING, lets in-flight RPCs finish, and stops hard
// after the drain limit. Safe to call more than once.
func (s *Server) Shutdown() {
	s.stopOnce.Do(func() {
		s.hmu.Lock()
		s.shutdown = true
		s.hmu.Unlock()
		s.Health.Shutdown()
		s.stopEarly()
		timer := time.AfterFunc(s.drain, func() {
			s.log.Warn("drain limit reached, stopping hard", zap.Duration("drain", s.drain))
			// Cut first: GracefulStop and Stop both wait for a
			// connection still in its handshake, and a client that
			// connected and sent nothing held the process past its
			// drain for grpc's connection timeout, 120 s.
			s.hmu.Lock()
			conns := s.conns
			s.hmu.Unlock()
			if conns != nil {
				conns.cut()
			}
			s.GRPC.Stop()
		})
		s.GRPC.GracefulStop()
		timer.Stop()
		if s.earlyLis != nil {
			// Serve may never have run (a start that failed); when it
			// did, its stop closed it already.
			s.earlyLis.Close()
		}
	})
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer s.recoverPanic(info.FullMethod, &err)
	start := time.Now()
	resp, err = handler(ctx, req)
	err = s.toStatus(info.FullMethod, err)
	s.logCall(info.FullMethod, start, err)
	return resp, err
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer s.recoverPanic(info.FullMethod, &err)
	start := time.Now()
	err = s.toStatus(info.FullMethod, handler(srv, ss))
	s.logCall(info.FullMethod, start, err)
	return err
}

// ErrDiskFull is what a call that failed for want of disk space (ENOSPC,
// EDQUOT) answers, as an unavailable dependency.
var ErrDiskFull = errors.New("no space left on the disk")

// ErrReadOnly is what a call that failed on a read-only file system
// (EROFS: a disk remounted read-only after errors, a volume mounted so)
// answers, as an unavailable dependency: "<service> failed" told the
// operator nothing to mend.
var ErrReadOnly = errors.New("the disk is read-only")

// ClassifyError lets a process name the dependency behind an error (the
// service frame sets it to recognise an unreachable database): it returns
// a status error for err, or nil when it does not recognise it.
func (s *Server) ClassifyError(fn func(error) error) { s.classify = fn }

// toStatus makes every error leaving a handler a status: a status passes
// as it is; a context error is Canceled or DeadlineExceeded; a dependency
// the classifier recognises, and a disk full, are Unavailable with their
// name; anything else is logged here, with its chain, and sent as
// Internal "internal error", so no database or file system text reaches
// another process.
func (s *Server) toStatus(method string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		// Said to the client as it is (a disk full is theirs to mend, and
		// an upload committed then stays staged for another try); the
		// path stays in this log.
		s.log.Warn("rpc failed: disk full", zap.String("method", method), zap.Error(err))
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, ErrDiskFull.Error())
	}
	if errors.Is(err, syscall.EROFS) {
		s.log.Warn("rpc failed: read-only file system", zap.String("method", method), zap.Error(err))
		return rpcerr.Error(codes.Unavailable, rpcerr.ReasonDependency, rpcerr.NoIndex, ErrReadOnly.Error())
	}
	if s.classify != nil {
		if st := s.classify(err); st != nil {
			s.log.Warn("rpc failed: dependency unavailable", zap.String("method", method), zap.Error(err))
			return st
		}
	}
	s.log.Error("rpc failed", zap.String("method", method), zap.Error(err))
	return status.Error(codes.Internal, "internal error")
}

func (s *Server) recoverPanic(method string, err *error) {
	if r := recover(); r != nil {
		s.log.Error("panic in rpc handler", zap.String("method", method), zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		*err = status.Error(codes.Internal, "internal error")
	}
}

func (s *Server) logCall(method string, start time.Time, err error) {
	code := status.Code(err)
	fields := []zap.Field{zap.String("method", method), zap.Duration("took", time.Since(start)), zap.Stringer("code", code)}
	switch code {
	case codes.OK, codes.Canceled, codes.NotFound, codes.InvalidArgument, codes.AlreadyExists,
		codes.PermissionDenied, codes.FailedPrecondition, codes.Unauthenticated, codes.ResourceExhausted:
		s.log.Debug("rpc", fields...)
	default:
		s.log.Warn("rpc failed", append(fields, zap.Error(err))...)
	}
}

// Listen listens on addr: an absolute path is a Unix socket (made with
// unixsock's care), anything else a TCP host:port.
func Listen(addr string) (net.Listener, error) {
	if strings.HasPrefix(addr, "/") {
		return unixsock.Listen(addr)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}
