package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// Twelve connections each pipeline 200 requests for the largest page of
// a transcript and read nothing. Each is within its own bounds (the
// write-stall rule needs 30 s to close it), but before the gateway-wide
// output budget they held 1.9 GiB of the gateway together within 25 s.
// Now what the gateway holds for them is bounded by
// rpc.max_buffered_output_bytes: past it a connection holding more than
// its share is closed, and a client that reads is served throughout.
func TestNonReadingConnectionsBoundedTogether(t *testing.T) {
	t.Parallel()
	const (
		attackers = 12
		budget    = 64 * mib
	)
	s := e2e.Start(t, e2e.Options{Args: []string{
		"--set", "rpc.max_buffered_output_bytes=" + strconv.Itoa(budget),
	}})
	v := newConv(t, s, nil)
	var sessions []string
	word := strings.Repeat("x", mib-2)
	for range 2 {
		id := v.newSession("")
		for range 3 {
			v.call("session/prompt", map[string]any{"session_id": id, "prompt": word})
		}
		sessions = append(sessions, id)
	}
	reply := int64(len(v.call("session/messages", map[string]any{"session_id": sessions[0], "limit": 1000})))
	gw := s.PIDOf("gateway")
	before := rssOf(t, gw)
	stop := make(chan struct{})
	peak := peakRSS(t, gw, stop)
	closed := make(chan int, attackers)
	flooded := time.Now()
	for a := range attackers {
		c, err := net.Dial("unix", s.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var frames bytes.Buffer
		frames.WriteString(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocol_version":1}}` + "\n")
		for i := 1; i <= 200; i++ {
			// Pages of different reads: concurrent reads of one page
			// would share one reply's making.
			fmt.Fprintf(&frames, `{"jsonrpc":"2.0","id":%d,"method":"session/messages","params":{"session_id":%q,"limit":%d}}`+"\n", i, sessions[(a+i)%2], 900+i%50)
		}
		go func() {
			_, _ = c.Write(frames.Bytes())
			// Read nothing until the gateway gave up on this client:
			// over the budget at once, or by the write-stall rule (30 s)
			// for one under it. It used to sleep 20 s, then read what was
			// left and wait 30 s more for an end a drained connection
			// never gets: 50 s a test for a connection the budget spared.
			if err := awaitHangUp(c, 90*time.Second); err != nil {
				t.Errorf("attacker %d: %v", a, err)
			}
			closed <- a
		}()
	}
	good := s.Dial(t)
	if _, err := good.Initialize(); err != nil {
		t.Fatal(err)
	}
	// Served throughout: every 300 ms until the last attacker is gone,
	// and 30 times at least.
	for i, gone := 0, 0; gone < attackers || i < 30; i++ {
		if _, err := good.Call("health", nil); err != nil {
			t.Fatalf("a client that reads, during the flood: %v", err)
		}
		select {
		case <-closed:
			gone++
		case <-time.After(300 * time.Millisecond):
		}
	}
	close(stop)
	t.Logf("the last of %d attackers gone %v after the flood began", attackers, time.Since(flooded).Round(time.Millisecond))
	// The largest reply reaches a client that reads, whatever is held.
	if _, err := good.Call("session/messages", map[string]any{"session_id": sessions[0], "limit": 1000}); err != nil {
		t.Fatalf("a client that reads, after the flood: %v", err)
	}
	grown := testwait.Recv(t, peak) - before
	cut := map[string]bool{}
	for _, line := range strings.Split(readLog(t, s, "gateway"), "\n") {
		var entry struct {
			Msg  string `json:"msg"`
			Conn any    `json:"conn"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && strings.Contains(entry.Msg, "output held for clients is over its bound") {
			cut[fmt.Sprint(entry.Conn)] = true
		}
	}
	// Held for the clients: the budget, plus for each connection its
	// share and the reply that passed it (docs/spec.md §3). In memory:
	// twice that, as a reply waiting for room in its connection's queue
	// is held as its result and as its JSON (and a queue's array has room
	// to grow into), twice again for the collector's headroom, and 64 MiB
	// for the runtime and the replies in the making.
	bound := 4*(budget+attackers*(2*mib+reply)) + 64*mib
	t.Logf("gateway RSS %d MiB before, peak growth %d MiB (bound %d MiB); %d of %d connections closed over the budget",
		before/mib, grown/mib, bound/mib, len(cut), attackers)
	if len(cut) == 0 {
		t.Fatal("no connection was closed over the output budget")
	}
	if grown > bound {
		t.Fatalf("gateway RSS grew %d MiB with %d connections reading nothing, over the bound of %d MiB", grown/mib, attackers, bound/mib)
	}
}

// awaitHangUp waits, reading nothing, until the peer of a Unix socket has
// closed it (POLLHUP, POLLRDHUP or POLLERR: the gateway's close with our
// requests unread is a reset), for at most within.
func awaitHangUp(c net.Conn, within time.Duration) error {
	raw, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	end := time.Now().Add(within)
	for time.Now().Before(end) {
		var revents int16
		var perr error
		if err := raw.Control(func(fd uintptr) {
			// Short polls: Control holds the descriptor while it runs.
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if _, perr = unix.Poll(fds, 200); perr == nil {
				revents = fds[0].Revents
			}
		}); err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		if perr != nil && !errors.Is(perr, unix.EINTR) {
			return fmt.Errorf("poll: %w", perr)
		}
		if revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0 {
			return nil
		}
	}
	return fmt.Errorf("the gateway still has the connection after %v", within)
}
