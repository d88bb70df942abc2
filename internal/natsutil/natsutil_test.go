package natsutil

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// stallProxy relays TCP connections to a server; while stalled it stops
// reading what clients send, as a bus server that hangs (SIGSTOP, docker
// pause, a stuck disk) stops reading its clients. What the server sends
// still goes through.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
	closed  bool
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		// A small buffer on the stalled side: the client's writes block
		// after little data, not after megabytes the kernel would take.
		_ = c.(*net.TCPConn).SetReadBuffer(16 << 10)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
			c.Close()
		}()
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 16<<10)
			for {
				for p.stalled.Load() && !p.isClosed() {
					time.Sleep(10 * time.Millisecond)
				}
				n, err := c.Read(buf)
				if n > 0 {
					if _, err := s.Write(buf[:n]); err != nil {
						c.Close()
						return
					}
				}
				if err != nil {
					s.Close()
					return
				}
			}
		}()
	}
}

func (p *stallProxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// stateLog records what a connection's OnState was told, last first.
type stateLog struct {
	mu   sync.Mutex
	last error
	up   bool
	n    int
}

func (s *stateLog) report(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.up = err, err == nil
	s.n++
}

func (s *stateLog) get() (last error, up bool, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.up, s.n
}

// A bus server that stops reading must not hold a publish for nats.go's
// default write timeout of a minute (the session service publishes under
// its session's locks, so every turn would stall with it) while health
// says serving: the publish fails within a few seconds, the bus is
// reported down, and it is reported up again once the server reads again.
func TestPublishToStalledServerFailsAndReportsBusDown(t *testing.T) {
	u, err := url.Parse(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	p := startStallProxy(t, u.Host)
	var states stateLog
	nc, err := Connect(Options{URL: p.url(), Name: "session", Log: zap.NewNop(), OnState: states.report})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// nats.go tells a first connect made with RetryOnFailedConnect from
	// its callback goroutine, after Connect returned: wait for it.
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		if _, up, _ := states.get(); !up {
			return errors.New("connected, yet the bus is not reported up")
		}
		return nil
	})

	p.stalled.Store(true)
	// Publish until a write blocks on the stalled server and fails. The
	// bound is liveness: without a write timeout a publish waits a minute.
	payload := make([]byte, 256<<10)
	failed := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := Publish(nc, "clawmesh.test.stall", payload); err != nil {
				failed <- fmt.Errorf("publish %d: %w", i, err)
				return
			}
			if nc.IsClosed() {
				failed <- errors.New("connection closed")
				return
			}
		}
	}()
	select {
	case err := <-failed:
		t.Logf("stalled server: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("publishing to a stalled bus server did not fail within 10s")
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		if last, up, _ := states.get(); up {
			return fmt.Errorf("bus still reported up (last state %v)", last)
		}
		return nil
	})

	// The server reads again: the connection comes back, and says so.
	p.stalled.Store(false)
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if last, up, _ := states.get(); !up {
			return fmt.Errorf("bus still reported down: %v", last)
		}
		return nil
	})
	sub, err := nats.Connect(u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got, err := sub.SubscribeSync("clawmesh.test.after")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := Publish(nc, "clawmesh.test.after", []byte("up")); err != nil {
		t.Fatalf("publish after the server came back: %v", err)
	}
	if _, err := got.NextMsg(10 * time.Second); err != nil {
		t.Fatalf("a publish after the server came back was not delivered: %v", err)
	}
}

// Each wait is within its bound: no more than FirstReconnectWait for the
// first attempt of an outage, a bound doubling from there up to
// MaxReconnectWait, and never less than half of it (the jitter).
func TestReconnectDelayBacksOffWithinBounds(t *testing.T) {
	bound := FirstReconnectWait
	for n := 1; n <= 40; n++ {
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 1000 {
			d := reconnectDelay(n)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < bound/2 || hi > bound {
			t.Fatalf("attempt %d: waits from %v to %v, want within [%v, %v]", n, lo, hi, bound/2, bound)
		}
		if hi-lo < bound/4 {
			t.Fatalf("attempt %d: waits from %v to %v: no jitter to speak of", n, lo, hi)
		}
		bound = min(2*bound, MaxReconnectWait)
	}
}

// A bus server that is down is not hammered: the first reconnect attempt
// comes at once, the later ones back off (a fixed 200 ms wait made about
// twenty in four seconds, from every process of the stack), and once the
// server is back the connection is up again within MaxReconnectWait.
func TestReconnectBacksOffWhileServerIsDown(t *testing.T) {
	srv := testenv.StartNATS(t)
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	var states stateLog
	nc, err := Connect(Options{URL: srv.URL(), Name: "session", Log: zap.NewNop(), OnState: states.report})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	down := time.Now()
	// The server's port now answers and hangs up at once: each
	// connection it takes is one reconnect attempt.
	ln, err := net.Listen("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	attempts := make(chan time.Time, 1000)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			attempts <- time.Now()
			c.Close()
		}
	}()
	const window = 4 * time.Second
	time.Sleep(window) // the rate over a window is what is measured
	ln.Close()
	var at []time.Duration
	for len(attempts) > 0 {
		at = append(at, (<-attempts).Sub(down).Round(time.Millisecond))
	}
	t.Logf("reconnect attempts at %v after the server went down", at)
	if len(at) == 0 || at[0] > FirstReconnectWait+300*time.Millisecond {
		t.Fatalf("the first reconnect attempt did not come at once: attempts at %v", at)
	}
	if len(at) > 7 {
		t.Fatalf("%d reconnect attempts in %v: no backoff (attempts at %v)", len(at), window, at)
	}

	srv.Start()
	back := time.Now()
	testenv.Eventually(t, MaxReconnectWait+2*time.Second, 10*time.Millisecond, func() error {
		if last, up, _ := states.get(); !up {
			return fmt.Errorf("bus still reported down: %v", last)
		}
		return nil
	})
	t.Logf("reconnected %v after the server came back", time.Since(back).Round(time.Millisecond))
}

// A bus server that hangs while the connection is idle (nothing to
// write, so no write fails) is taken for gone by the stall check: a
// call waiting on it (a subscription's flush, 10 s as the gateway's) is
// failed when it is seen, not at its own deadline, the bus is reported
// down, and both come back once the server reads again. Before, only
// nats.go's pings noticed, 10 to 15 s in: the flush waited its 10 s
// and failed with a timeout while health still said serving.
func TestHungServerIsSeenBeforeACallsDeadline(t *testing.T) {
	u, err := url.Parse(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	p := startStallProxy(t, u.Host)
	var states stateLog
	nc, err := Connect(Options{URL: p.url(), Name: "gateway", Log: zap.NewNop(), OnState: states.report})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	p.stalled.Store(true)
	// The proxy's reader was already waiting: what it reads next still
	// goes through, and it stops after.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = nc.FlushTimeout(10 * time.Second)
	if err == nil || errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a flush while the server hung: %v, want it failed once the server is seen hung, before its deadline", err)
	}
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() error {
		last, up, _ := states.get()
		if up || !strings.Contains(fmt.Sprint(last), "server not answering") {
			return fmt.Errorf("the flush failed, the bus reported %v, want down: server not answering", last)
		}
		return nil
	})
	last, _, _ := states.get()
	t.Logf("the flush failed after %v: %v; health: %v", time.Since(start).Round(time.Millisecond), err, last)

	p.stalled.Store(false)
	testenv.Eventually(t, 20*time.Second, 20*time.Millisecond, func() error {
		if last, up, _ := states.get(); !up {
			return fmt.Errorf("bus still reported down: %v", last)
		}
		return nil
	})
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatalf("a flush once the server answers again: %v", err)
	}
}

// The stall check is the connection's: closing the connection ends it,
// not its next tick (StallCheckEvery later), so a process that closes
// its bus link on the way out leaves no check running behind it.
func TestStallCheckEndsWithItsConnection(t *testing.T) {
	nc, err := Connect(Options{URL: testenv.NATS(t), Name: "stall-check-owner"})
	if err != nil {
		t.Fatal(err)
	}
	running := func() bool {
		buf := make([]byte, 16<<20)
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "natsutil.watchStall")
	}
	// Started beside Connect's return: looked for until it shows.
	for deadline := time.Now().Add(5 * time.Second); !running(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no stall check runs on a new connection")
		}
	}
	nc.Close()
	// Well inside the tick: the check ended with the close, not at its
	// next ask.
	deadline := time.Now().Add(StallCheckEvery / 2)
	for running() {
		if time.Now().After(deadline) {
			t.Fatalf("the stall check still runs %v after its connection closed", StallCheckEvery/2)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
