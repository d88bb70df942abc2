package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/ids"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// fakeConfig binds every peer as the operator.
type fakeConfig struct {
	configv1.UnimplementedConfigServiceServer
}

func (fakeConfig) ResolvePrincipal(context.Context, *configv1.ResolvePrincipalRequest) (*configv1.ResolvePrincipalResponse, error) {
	return &configv1.ResolvePrincipalResponse{Principal: &commonv1.Principal{PrincipalId: "shared-operator", Operator: true}}, nil
}

// fakeSession accepts every session/new after a delay the test picks, and
// tells the test when it answers, whatever the caller's context says by
// then: a reply already on its way when the client goes.
type fakeSession struct {
	sessionv1.UnimplementedSessionServiceServer
	delay    func() time.Duration
	answered chan struct{}
}

func (f *fakeSession) NewSession(_ context.Context, req *sessionv1.NewSessionRequest) (*sessionv1.NewSessionResponse, error) {
	time.Sleep(f.delay())
	id := ids.New("s-")
	subject, err := bus.SessionUpdateSubject(id, 1)
	if err != nil {
		return nil, err
	}
	defer func() { f.answered <- struct{}{} }()
	return &sessionv1.NewSessionResponse{SessionId: id, AgentAlias: "default", UpdateSubject: subject}, nil
}

func (f *fakeSession) ConnectionClosed(context.Context, *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	return &sessionv1.ConnectionClosedResponse{}, nil
}

// serveFake serves register's services on a Unix socket and dials it.
func serveFake(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "svc.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(lis) //nolint:errcheck // ends at Stop
	t.Cleanup(srv.Stop)
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// A session/new whose reply races the client's disconnect: the gateway
// tears a connection down only after every handler of it returned, so an
// attach made by a handler that finished after the client left is undone
// with the rest. After each round no connection state, no topic and no
// bus subscription is left.
func TestAttachRacingDisconnectLeavesNoSubscription(t *testing.T) {
	sess := &fakeSession{answered: make(chan struct{}, 1)}
	var mu sync.Mutex
	var delay time.Duration
	sess.delay = func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return delay
	}
	g, socket := runGateway(t, sess, 10*time.Second)
	nc := g.nats
	baseline := nc.NumSubscriptions()

	const rounds = 60
	for round := range rounds {
		mu.Lock()
		delay = time.Duration(rand.IntN(3000)) * time.Microsecond
		mu.Unlock()
		c, err := rpcclient.Dial(socket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Initialize(); err != nil {
			t.Fatal(err)
		}
		if err := c.Send(`{"jsonrpc":"2.0","id":7,"method":"session/new","params":{}}`); err != nil {
			t.Fatal(err)
		}
		// Leave as the reply is on its way (now and then a little after
		// or before it), so the handler attaches around the disconnect.
		testwait.Recv(t, sess.answered)
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		c.Close()
		// The state is forgotten before the teardown detaches and
		// unsubscribes: what must go is polled for, not read once.
		testenv.Eventually(t, 10*time.Second, time.Millisecond, func() error {
			g.mu.Lock()
			open := len(g.states)
			g.mu.Unlock()
			if open != 0 {
				return fmt.Errorf("round %d: %d connection states left", round, open)
			}
			g.hub.mu.Lock()
			topics := len(g.hub.topics)
			g.hub.mu.Unlock()
			if topics != 0 || nc.NumSubscriptions() != baseline {
				return fmt.Errorf("round %d: %d topics and %d subscriptions left after the disconnect (baseline %d)",
					round, topics, nc.NumSubscriptions(), baseline)
			}
			return nil
		})
	}
}
