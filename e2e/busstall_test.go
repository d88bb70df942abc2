package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/natsembed"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// busChildEnv names the bus server a child of this test binary runs
// (startChild): "<port> <data dir>", admitting the data directory's
// identities as an operator's external server would. In a process of its
// own it can be stopped (SIGSTOP) as a hung server is.
const busChildEnv = "CLAWMESH_E2E_BUS"

// serveBus runs the server busChildEnv names until the process ends.
func serveBus(spec string) {
	port, dir, _ := strings.Cut(spec, " ")
	p, err := strconv.Atoi(port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bus: bad port:", err)
		os.Exit(2)
	}
	keys, err := bus.EnsureCredentials(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bus: credentials:", err)
		os.Exit(2)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: p, NoLog: true, NoSigs: true,
		MaxPayload: bus.MaxPayload, MaxPending: bus.MaxPending, WriteDeadline: bus.WriteDeadline,
		Nkeys: natsembed.Users(keys),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bus:", err)
		os.Exit(2)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "bus: not ready")
		os.Exit(2)
	}
	srv.WaitForShutdown()
}

// startBusChild makes dir's credentials, runs a bus server for them in a
// child process on a free port, and returns its pid and URL.
func startBusChild(t *testing.T, dir string) (pid int, url string) {
	t.Helper()
	if _, err := bus.EnsureCredentials(dir); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	pid = startChild(t, fmt.Sprintf("%s=%d %s", busChildEnv, l.Addr().(*net.TCPAddr).Port, dir))
	// A stopped child cannot see its stdin end: it is continued first
	// (cleanups run last-registered first).
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	testenv.Eventually(t, 15*time.Second, 10*time.Millisecond, func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
	return pid, "nats://" + addr
}

// streamedTurn is what one streamed turn looked like to its client.
type streamedTurn struct {
	at        time.Time
	chunks    int // agent_message_chunk updates of the turn
	completes int // turn_complete updates of the turn
	outcome   string
	err       error // the prompt's error, or the connection's end
	// whole says the chunks' text is the answer's content and one
	// turn_complete came: a turn's missed middle is sent again with its
	// chunks of one stored event joined (fewer chunks, the same text).
	whole bool
}

// streamer prompts its session one turn of chunks chunks after another,
// on a connection of its own, until stop closes; a connection that ends
// is replaced by a new one with a new session.
type streamer struct {
	socket string
	chunks int
	mu     sync.Mutex
	turns  []streamedTurn
}

func (s *streamer) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		var c *e2e.Client
		var session string
		defer func() {
			if c != nil {
				c.Close()
			}
		}()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if c == nil {
				var err error
				if c, session, err = s.open(); err != nil {
					c = nil
					time.Sleep(200 * time.Millisecond)
					continue
				}
			}
			kinds := updateKinds{}
			var text strings.Builder
			onUpdateTexts(c, kinds, &text)
			raw, err := c.Call("session/prompt", map[string]any{"session_id": session, "prompt": fmt.Sprintf("/stamp %d 10", s.chunks)})
			r := streamedTurn{at: time.Now(), chunks: kinds["agent_message_chunk"], completes: kinds["turn_complete"], err: err}
			if err == nil {
				var resp struct {
					Outcome string `json:"outcome"`
					Content string `json:"content"`
				}
				_ = json.Unmarshal(raw, &resp)
				r.outcome = resp.Outcome
				r.whole = r.completes == 1 && resp.Content != "" && text.String() == resp.Content
			}
			s.mu.Lock()
			s.turns = append(s.turns, r)
			s.mu.Unlock()
			if err != nil {
				c.Close()
				c = nil
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}

// streamedWhole reports whether the client's last turn ended after
// since, all its chunks streamed, its text whole.
func (s *streamer) streamedWhole(since time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.turns) == 0 {
		return false
	}
	last := s.turns[len(s.turns)-1]
	return last.at.After(since) && last.err == nil && last.chunks == s.chunks && last.whole
}

func (s *streamer) open() (*e2e.Client, string, error) {
	c, err := e2e.Dial(s.socket)
	if err != nil {
		return nil, "", err
	}
	c.Timeout = 60 * time.Second
	if _, err := c.Initialize(); err != nil {
		c.Close()
		return nil, "", err
	}
	session, err := newSession(c)
	if err != nil {
		c.Close()
		return nil, "", err
	}
	return c, session, nil
}

// stackOnBusChild starts a stack whose NATS server runs in a child
// process of this test (startBusChild), so that a test may stop it
// (SIGSTOP) without stopping the stack's processes; pid is the child's.
func stackOnBusChild(t *testing.T) (s *e2e.Stack, pid int) {
	t.Helper()
	dir := e2e.TempDataDir(t)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pid, url := startBusChild(t, dir)
	return e2e.Start(t, e2e.Options{DataDir: dir, Env: []string{"NATS_URL=" + url}}), pid
}

// The bus server hangs (SIGSTOP) for 20 s while four clients stream
// turns of 100 chunks. No turn is answered as ended over a stream that
// lacks text or its turn_complete: each turn the stall cut is sent again
// whole from the store (its missed chunks of one stored event joined),
// or fails or ends its connection. Health says the gateway is not_serving during the
// stall, once its link is seen stale, and serving after; and every client
// streams whole turns again once the server runs. Before, every turn in
// the stall was answered "completed" with 66 of 100 chunks, or none, and
// no turn_complete.
func TestBusStoppedWhileSessionsStreamIsNoSilentHole(t *testing.T) {
	t.Parallel()
	s, pid := stackOnBusChild(t)
	hc := s.Dial(t)
	if _, err := hc.Initialize(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return upServing(hc) })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var streamers []*streamer
	for range 4 {
		st := &streamer{socket: s.Socket, chunks: 100}
		st.run(stop, &wg)
		streamers = append(streamers, st)
	}
	// The bus stops while every client streams: each has had a whole
	// turn through, and prompts its next at once (where a fixed 3 s
	// stood for that, and was either too long or, starved, too short).
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() error {
		for i, st := range streamers {
			if !st.streamedWhole(time.Time{}) {
				return fmt.Errorf("client %d has streamed no whole turn yet", i)
			}
		}
		return nil
	})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// A session made in the stall, before the gateway's link is seen
	// stale (busDown lets it through), fails as the bus's failure.
	made := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		c, err := e2e.Dial(s.Socket)
		if err != nil {
			made <- err
			return
		}
		defer c.Close()
		c.Timeout = 60 * time.Second
		if _, err := c.Initialize(); err != nil {
			made <- err
			return
		}
		_, err = newSession(c)
		made <- err
	}()
	var said string
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error {
		_, inHealth, lastError, err := gatewayWord(hc)
		if err != nil {
			return err
		}
		if inHealth != "not_serving" {
			return fmt.Errorf("the gateway is %q with its bus server stopped", inHealth)
		}
		said = lastError
		return nil
	})
	t.Logf("%v into the stall, the gateway is not_serving: %s", time.Since(stopped).Round(time.Millisecond), said)
	var re *e2e.RPCError
	if err := <-made; !errors.As(err, &re) || re.Code != -32603 || re.Message != "gateway: bus unavailable" {
		t.Errorf("session/new in the stall: %v, want -32603 gateway: bus unavailable", err)
	} else {
		t.Logf("session/new in the stall: %v after %v", err, time.Since(stopped.Add(time.Second)).Round(time.Millisecond))
	}
	time.Sleep(time.Until(stopped.Add(20 * time.Second)))
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	testenv.Eventually(t, 15*time.Second, 100*time.Millisecond, func() error {
		_, inHealth, _, err := gatewayWord(hc)
		if err != nil {
			return err
		}
		if inHealth != "serving" {
			return fmt.Errorf("the gateway is %q with its bus server running again", inHealth)
		}
		return nil
	})
	t.Logf("%v after the server resumed, the gateway is serving", time.Since(resumed).Round(time.Millisecond))
	// Every client streams whole turns again.
	testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() error {
		for i, st := range streamers {
			if !st.streamedWhole(resumed) {
				return fmt.Errorf("client %d has streamed no whole turn since the server resumed", i)
			}
		}
		return nil
	})
	close(stop)
	wg.Wait()

	for i, st := range streamers {
		cut := 0
		for _, r := range st.turns {
			switch {
			case r.err != nil:
				cut++
			case r.outcome == "completed" && !r.whole:
				t.Errorf("client %d: a turn %v into the stall was answered completed over %d chunks (of %d) whose text is not its content, and %d turn_complete",
					i, r.at.Sub(stopped).Round(time.Millisecond), r.chunks, st.chunks, r.completes)
			case r.outcome == "completed" && r.chunks != st.chunks:
				t.Logf("client %d: a turn %v into the stall was answered completed, its text whole in %d chunks (its missed middle sent again)",
					i, r.at.Sub(stopped).Round(time.Millisecond), r.chunks)
			}
		}
		t.Logf("client %d: %d turns, %d failed or cut", i, len(st.turns), cut)
	}
}
