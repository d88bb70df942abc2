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
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/unixsock"
)

// DefaultDrain bounds how long in-flight RPCs may run after shutdown
// starts before they are cut.
const DefaultDrain = 10 * time.Second

// Server wraps a grpc.Server with its health service.
type Server struct {
	GRPC   *grpc.Server
	Health *health.Server

	log      *zap.Logger
	drain    time.Duration
	stopOnce sync.Once
}

// New builds a server. drain is the hard limit of a graceful stop; zero
// means DefaultDrain.
func New(log *zap.Logger, drain time.Duration, opts ...grpc.ServerOption) *Server {
	if drain <= 0 {
		drain = DefaultDrain
	}
	s := &Server{log: log, drain: drain, Health: health.NewServer()}
	opts = append(opts,
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
		grpc.MaxRecvMsgSize(16<<20),
		grpc.MaxSendMsgSize(16<<20),
	)
	s.GRPC = grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(s.GRPC, s.Health)
	reflection.Register(s.GRPC)
	return s
}

// SetServing marks the overall health and each named service SERVING.
func (s *Server) SetServing(services ...string) {
	s.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	for _, name := range services {
		s.Health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
}

// Serve serves lis until ctx is done, then drains. It returns nil after a
// shutdown caused by ctx, or the listener's error.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.GRPC.Serve(lis) }()
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
		s.Health.Shutdown()
		timer := time.AfterFunc(s.drain, func() {
			s.log.Warn("drain limit reached, stopping hard", zap.Duration("drain", s.drain))
			s.GRPC.Stop()
		})
		s.GRPC.GracefulStop()
		timer.Stop()
	})
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer s.recoverPanic(info.FullMethod, &err)
	start := time.Now()
	resp, err = handler(ctx, req)
	s.logCall(info.FullMethod, start, err)
	return resp, err
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer s.recoverPanic(info.FullMethod, &err)
	start := time.Now()
	err = handler(srv, ss)
	s.logCall(info.FullMethod, start, err)
	return err
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
