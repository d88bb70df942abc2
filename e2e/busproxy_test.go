package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// busProxy stands between a stack and its bus server: it relays each
// connection as it is, and can cut one process's link and keep it down
// (refusing that process's reconnects) while the others come back, as a
// fault on that process's side of the network would.
type busProxy struct {
	t      *testing.T
	l      net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]string // client side, by the name its CONNECT gave ("" before)
	blocked string
	// held names the process whose downlink (bus server to process) is
	// held back while set: what the server sends it waits in the proxy,
	// its link up, as on a congested or stalled path (hold).
	held     string
	released chan struct{}
	wg       sync.WaitGroup
}

func newBusProxy(t *testing.T, target string) *busProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &busProxy{t: t, l: l, target: target, conns: map[net.Conn]string{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.relay(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.cut(func(string) bool { return true })
		p.wg.Wait()
	})
	return p
}

func (p *busProxy) url() string { return "nats://" + p.l.Addr().String() }

// relay carries c to the bus server and back; a client whose CONNECT
// names the blocked process is dropped there.
func (p *busProxy) relay(c net.Conn) {
	defer c.Close()
	p.mu.Lock()
	p.conns[c] = ""
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer up.Close()
	var down sync.WaitGroup
	down.Add(1)
	go func() {
		defer down.Done()
		_, _ = io.Copy(heldWriter{p: p, c: c}, up)
		c.Close()
	}()
	defer down.Wait()
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return
	}
	var connect struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "CONNECT ")), &connect)
	p.mu.Lock()
	blocked := p.blocked != "" && connect.Name == p.blocked
	if _, ok := p.conns[c]; ok {
		p.conns[c] = connect.Name
	}
	p.mu.Unlock()
	if blocked {
		up.Close()
		return
	}
	if _, err := io.WriteString(up, line); err != nil {
		return
	}
	_, _ = io.Copy(up, br)
	up.Close()
}

// cut closes the connections whose process name matches.
func (p *busProxy) cut(match func(name string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, name := range p.conns {
		if match(name) {
			c.Close()
		}
	}
}

// block cuts the link of the process named name and refuses its
// reconnects from then on.
func (p *busProxy) block(name string) {
	p.mu.Lock()
	p.blocked = name
	p.mu.Unlock()
	p.cut(func(n string) bool { return n == name })
}

// unblock lets the blocked process reconnect again.
func (p *busProxy) unblock() {
	p.mu.Lock()
	p.blocked = ""
	p.mu.Unlock()
}

// hold holds back what the bus server sends the process named name until
// the returned release is called (at the latest at the test's end).
func (p *busProxy) hold(name string) (release func()) {
	p.mu.Lock()
	p.held, p.released = name, make(chan struct{})
	ch := p.released
	p.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			p.mu.Lock()
			p.held = ""
			p.mu.Unlock()
			close(ch)
		})
	}
	p.t.Cleanup(release)
	return release
}

// heldWriter writes to c, the client side of a relayed connection, once
// its process is not held.
type heldWriter struct {
	p *busProxy
	c net.Conn
}

func (w heldWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	held := w.p.held != "" && w.p.conns[w.c] == w.p.held
	ch := w.p.released
	w.p.mu.Unlock()
	if held {
		<-ch
	}
	return w.c.Write(b)
}

// startBehindBusProxy starts a stack whose bus link goes through a
// busProxy to a bus server of the test's.
func startBehindBusProxy(t *testing.T) (*externalBus, *busProxy) {
	t.Helper()
	return startPluginsBehindBusProxy(t, nil)
}

// The session service's own bus link goes down mid-turn and stays down,
// and the gateway's drops and comes back: the turn's later updates wait
// in the session service's buffer, and every UpdateSeqs answer says "not
// flushed" with a number past what the follower received. Some 30 s
// after the first such answer the gateway takes the stream for one with
// a hole: it closes the follower, whose prompt fails, and says so once.
// Before, it asked the session service once a second for as long as it
// ran, and the follower waited on a stream that had stopped, told
// nothing.
func TestBusBackWithTheSessionServicesLinkDownClosesFollowersInTime(t *testing.T) {
	t.Parallel()
	b, px := startBehindBusProxy(t)
	c := b.s.Dial(t)
	c.Timeout = 150 * time.Second
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	session, err := newSession(c)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{}, 1)
	onUpdates(c, updateKinds{}, first)
	answered := make(chan error, 1)
	go func() {
		_, err := c.Call("session/prompt", map[string]any{"session_id": session,
			"prompt": "/say before\n/sleep 2000\n/say after\n/sleep 120000"})
		answered <- err
	}()
	select {
	case <-first:
	case err := <-answered:
		t.Fatalf("the prompt was answered before its first update: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no update of the turn in 30 s")
	}

	px.block("clawmesh-session")
	// "after" goes into the session service's buffer, its link down.
	time.Sleep(4 * time.Second)
	px.cut(func(name string) bool { return name == "clawmesh-gateway" })
	cut := time.Now()
	const said = "the session service's bus link stayed down after the gateway's came back"
	select {
	case err := <-answered:
		if err == nil {
			t.Fatal("the prompt was answered over a stream with a hole")
		}
		t.Logf("%v after the gateway's link was cut, the follower was closed: %v",
			time.Since(cut).Round(time.Millisecond), err)
	case <-time.After(75 * time.Second):
		t.Fatalf("the follower of a session whose updates never reached the bus is still open %v on\ngateway log:\n%s",
			time.Since(cut).Round(time.Second), readLog(t, b.s, "gateway"))
	}
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		log := readLog(t, b.s, "gateway")
		if n := strings.Count(log, said); n != 1 {
			return fmt.Errorf("the gateway said %d times that the session service's link stayed down", n)
		}
		return nil
	})
}
