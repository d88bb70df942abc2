package grpcserver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// counted answers Live with its replica's revision and counts the calls,
// and List's apart.
type counted struct {
	configv1.UnimplementedConfigServiceServer
	rev   int64
	calls atomic.Int64
	lists atomic.Int64
}

func (c *counted) List(context.Context, *configv1.ListRequest) (*configv1.ListResponse, error) {
	c.lists.Add(1)
	return &configv1.ListResponse{}, nil
}

func (c *counted) Live(context.Context, *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	c.calls.Add(1)
	return &configv1.LiveResponse{Revision: c.rev}, nil
}

// acceptCount counts the connections a listener accepted.
type acceptCount struct {
	net.Listener
	n atomic.Int64
}

func (a *acceptCount) Accept() (net.Conn, error) {
	c, err := a.Listener.Accept()
	if err == nil {
		a.n.Add(1)
	}
	return c, err
}

// replica is one process of a service with replicas, on a socket the
// launcher handed it (HoldEarly).
type replica struct {
	srv      *grpcserver.Server
	lis      net.Listener
	accepted *acceptCount
	svc      *counted
	stop     context.CancelFunc
	done     chan error
}

func newReplica(t testing.TB, sock string, rev int64) *replica {
	t.Helper()
	l, err := grpcserver.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{srv: grpcserver.New(testenv.Logger(t), time.Second), accepted: &acceptCount{Listener: l}, svc: &counted{rev: rev}}
	r.lis = r.srv.HoldEarly(r.accepted)
	configv1.RegisterConfigServiceServer(r.srv.GRPC, r.svc)
	t.Cleanup(func() {
		if r.stop != nil {
			r.stop()
			if err := <-r.done; err != nil {
				t.Errorf("serve: %v", err)
			}
			return
		}
		r.srv.Shutdown()
	})
	return r
}

// starting is service.Env.Starting: a step of the start said in health,
// and the handed socket answered from then on.
func (r *replica) starting(what string) {
	r.srv.SetStarting(what)
	r.srv.AnswerEarly()
}

func (r *replica) serve() {
	r.srv.SetServing()
	ctx, stop := context.WithCancel(context.Background())
	r.stop, r.done = stop, make(chan error, 1)
	go func() { r.done <- r.srv.Serve(ctx, r.lis) }()
}

// Two replicas of a service (--scale plugin-sandbox=2): one serves, the
// other is still starting (compiling its plugins) and, since its start
// says each compile in health, answers on its socket already. A client
// spreading calls over both (the gateway's plugins/list, the session's
// tool calls) sent every other call to the starting one, which failed it
// Unavailable ("plugin-sandbox unavailable" at the socket) while the
// other replica served. Calls now go only to a replica whose own server
// answers: not while it starts, nor between its SetServing and its
// Serve (the overall health name says SERVING there while the start's
// server still answers), and to it once it serves.
func TestCallsSkipAReplicaStillStarting(t *testing.T) {
	addr, rs := replicasOf(t, 2)
	a, b := rs[0], rs[1]
	a.starting("compiling plugin echo (tool world)")
	b.starting("compiling plugin echo (tool world)")
	b.serve()

	_, client := dialReplicas(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// callsServedByB makes calls until n more reached b, each answered.
	callsServedByB := func(n int64) {
		t.Helper()
		want := b.svc.calls.Load() + n
		for b.svc.calls.Load() < want {
			resp, err := client.Live(ctx, &configv1.LiveRequest{})
			if err != nil {
				t.Fatalf("a call with one replica serving (b served %d): %v", b.svc.calls.Load(), err)
			}
			if resp.GetRevision() != 2 {
				t.Fatalf("answered by revision %d, want b's", resp.GetRevision())
			}
		}
	}
	callsServedByB(20)
	// The client reached the starting replica: it was left, not unknown.
	testenv.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		if a.accepted.n.Load() == 0 {
			return errors.New("the starting replica got no connection")
		}
		return nil
	})
	callsServedByB(20)

	// Registered, not serving yet: its start's server still answers.
	a.srv.SetServing()
	callsServedByB(20)

	a.serve()
	testenv.Eventually(t, 20*time.Second, 10*time.Millisecond, func() error {
		if _, err := client.Live(ctx, &configv1.LiveRequest{}); err != nil {
			return err
		}
		if a.svc.calls.Load() == 0 {
			return errors.New("no call reached the replica once it served")
		}
		return nil
	})
}

// A client's calls come in patterns: the session's turn with one tool
// call is a ListTools and an ExecuteTool. gRPC's round_robin takes the
// replicas in turn over every call, so with two replicas each turn's
// ExecuteTool went to the same replica for as long as the replica set
// stayed as it was: a restarted replica got none (CI, the sixtieth
// round: TestCallsGoToTheReplicaServingWhileTheOtherStarts waited 60 s
// for a tool call to reach it), and one replica ran every tool. Each
// method's calls are now spread over the replicas by themselves.
func TestEachMethodsCallsAreSpreadWhateverComesBetween(t *testing.T) {
	addr, a, b := twoServingReplicasOf(t)
	_, client := dialReplicas(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Until both replicas are picked: the picker holds both from then
	// on, nothing changes it.
	for a.svc.calls.Load() == 0 || b.svc.calls.Load() == 0 {
		if _, err := client.Live(ctx, &configv1.LiveRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	liveA, liveB := a.svc.calls.Load(), b.svc.calls.Load()
	const turns = 10
	for range turns {
		if _, err := client.List(ctx, &configv1.ListRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.Live(ctx, &configv1.LiveRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	gotA, gotB := a.svc.calls.Load()-liveA, b.svc.calls.Load()-liveB
	if gotA != turns/2 || gotB != turns/2 {
		t.Fatalf("of %d calls each following another method's, replica a got %d and b %d, want half each", turns, gotA, gotB)
	}
}

// With every replica starting (a restart of them all, a stack's
// start) a call failed at once, Unavailable with gRPC's "health check
// failed", though the first replica to serve would have answered it
// moments later. A call now waits for one within its deadline, and says
// at the deadline that no replica serves yet. One replica alone is
// waited for the same way: dialled as by Dial, a call while it started
// failed at once with its start's words.
func TestCallsWaitForAReplicaToServe(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			addr, rs := replicasOf(t, n)
			for _, r := range rs {
				r.starting("compiling plugin echo (tool world)")
			}
			cc, client := dialReplicas(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// Every replica answered its health NOT_SERVING: the client is
			// in transient failure, where a call that does not wait fails
			// at once.
			cc.Connect()
			for st := cc.GetState(); st != connectivity.TransientFailure; st = cc.GetState() {
				if !cc.WaitForStateChange(ctx, st) {
					t.Fatalf("the client never saw every replica starting (%v)", st)
				}
			}

			short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err := client.Live(short, &configv1.LiveRequest{})
			cancelShort()
			if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.HasPrefix(st.Message(), grpcclient.NoReplicaServes) {
				t.Fatalf("a call while every replica starts, at its deadline: %v", err)
			}

			last := rs[n-1]
			done := make(chan error, 1)
			go func() {
				resp, err := client.Live(ctx, &configv1.LiveRequest{})
				if err == nil && resp.GetRevision() != int64(n) {
					err = fmt.Errorf("answered by revision %d, want %d", resp.GetRevision(), n)
				}
				done <- err
			}()
			last.serve()
			if err := <-done; err != nil {
				t.Fatalf("a call waiting while every replica starts, one then serving: %v", err)
			}
		})
	}
}

// A replica the launcher restarts is away for a moment (its socket
// gone, then listened on again): a call made while every replica is
// away waits for one within its deadline, as for a replica starting,
// and is answered once one is back: the grace before calls fail for
// want of a reachable replica (grpcclient.RestartGrace) is no shorter
// than a restart. One replica alone was not waited for: a call failed
// at once with the refused connect.
//
// A call without a deadline failed at once while every replica was
// away, however short the restart: it now waits for one as long as a
// restart is given (grpcclient.RestartGrace), and is answered by the
// replica restarted.
func TestACallWaitsForAReplicaRestarting(t *testing.T) {
	for _, c := range []struct {
		n        int
		deadline bool
	}{{1, true}, {2, true}, {1, false}, {2, false}} {
		n := c.n
		name := fmt.Sprintf("%d replicas", n)
		if !c.deadline {
			name += ", no deadline"
		}
		t.Run(name, func(t *testing.T) {
			addr, rs := replicasOf(t, n)
			for _, r := range rs {
				r.serve()
			}
			cc, client := dialReplicas(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			if _, err := client.Live(ctx, &configv1.LiveRequest{}); err != nil {
				t.Fatal(err)
			}
			// Every replica stops, its socket removed with its listener
			// (its Serve's end is put back for the cleanup to read).
			for _, r := range rs {
				r.stop()
				err := <-r.done
				r.done <- err
			}
			for st := cc.GetState(); st != connectivity.TransientFailure; st = cc.GetState() {
				if !cc.WaitForStateChange(ctx, st) {
					t.Fatalf("the client never saw every replica away (%v)", st)
				}
			}
			callCtx := ctx
			if !c.deadline {
				callCtx = context.Background()
			}
			done := make(chan error, 1)
			go func() {
				_, err := client.Live(callCtx, &configv1.LiveRequest{})
				done <- err
			}()
			// Restarted: a new process on the same socket.
			back := newReplica(t, strings.Split(addr, ",")[n-1], 9)
			back.serve()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("a call while every replica restarts: %v", err)
				}
			case <-time.After(grpcclient.RestartGrace + 30*time.Second):
				t.Fatal("a call while every replica restarts was never answered")
			}
			if back.svc.calls.Load() != 1 {
				t.Fatalf("the restarted replica served %d calls, want the one made while it was away", back.svc.calls.Load())
			}
		})
	}
}

// BenchmarkFirstCallOfANewClient is what a client dialled per call
// costs (the gateway's plugins/list): a new client of two replicas that
// serve, its first call, its close. DialReplicas asks each replica's
// health (a Watch) before its first call goes.
func BenchmarkFirstCallOfANewClient(b *testing.B) {
	addr := twoServingReplicas(b)
	for _, c := range dials {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			for b.Loop() {
				cc, err := c.dial(addr)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{}); err != nil {
					b.Fatal(err)
				}
				cc.Close()
			}
		})
	}
}

// twoServingReplicas starts two replicas that serve and returns the
// address of both, as the benchmarks dial them.
func twoServingReplicas(b *testing.B) string {
	addr, _, _ := twoServingReplicasOf(b)
	return addr
}

// twoServingReplicasOf is twoServingReplicas with the replicas.
func twoServingReplicasOf(t testing.TB) (addr string, a, b *replica) {
	addr, rs := replicasOf(t, 2)
	a, b = rs[0], rs[1]
	a.serve()
	b.serve()
	return addr, a, b
}

// replicasOf makes n replicas (revisions 1 to n), neither starting nor
// serving yet, and returns the address of all, as DialReplicas takes it.
func replicasOf(t testing.TB, n int) (string, []*replica) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cm-r-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socks, rs := make([]string, n), make([]*replica, n)
	for i := range n {
		socks[i] = filepath.Join(dir, fmt.Sprintf("%c.sock", 'a'+i))
		rs[i] = newReplica(t, socks[i], int64(i+1))
	}
	return strings.Join(socks, ","), rs
}

// dialReplicas is a client of addr through DialReplicas, closed with the
// test.
func dialReplicas(t testing.TB, addr string) (*grpc.ClientConn, configv1.ConfigServiceClient) {
	t.Helper()
	cc, err := grpcclient.DialReplicas(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc, configv1.NewConfigServiceClient(cc)
}

// dials are the two ways to dial replicas the benchmarks compare.
var dials = []struct {
	name string
	dial func(string, ...grpc.DialOption) (*grpc.ClientConn, error)
}{{"Dial", grpcclient.Dial}, {"DialReplicas", grpcclient.DialReplicas}}

// BenchmarkCallOfALongLivedClient is a call on a client kept open (the
// session service's tool calls) to two replicas that serve: the health
// checks are one stream a replica, not a cost of each call.
func BenchmarkCallOfALongLivedClient(b *testing.B) {
	addr := twoServingReplicas(b)
	for _, c := range dials {
		b.Run(c.name, func(b *testing.B) {
			cc, err := c.dial(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			client := configv1.NewConfigServiceClient(cc)
			ctx := context.Background()
			// Both replicas connected before the timing.
			for range 10 {
				if _, err := client.Live(ctx, &configv1.LiveRequest{}); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if _, err := client.Live(ctx, &configv1.LiveRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
