package e2e_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The turn stream's floor under the design (BenchmarkTurnStream's
// forward rows). The stack carries a chunk from the session service
// through NATS to the gateway and from there to the client's own socket;
// the NATS baseline stops at a subscriber. The forward rows carry the
// same bytes along the stack's path with nothing else done on it: a
// publisher in a process of its own (where the session service is)
// publishes each stream as the baseline's publisher does, and a
// forwarder in another (where the gateway is) subscribes to each stream
// and writes each message to its client's socket, as the gateway's
// fan-out does at the least, with no decoding, no check and no
// bookkeeping. The client reads as the stack's client does. What the
// stack's p50 is against the forward p50 is what its own work costs; the
// forward p50 against the baseline is about the least the design's path
// costs on the machine, written as plainly as Go allows.

const (
	forwardEnv     = "CLAWMESH_BENCH_FORWARD_SOCKET"   // the forwarder's socket path
	publishEnv     = "CLAWMESH_BENCH_PUBLISH_READY"    // the file the publisher writes once it listens
	forwardNATSEnv = "CLAWMESH_BENCH_FORWARD_NATS_URL" // the NATS server both use
	forwardGo      = "bench.forward.go"                // asks the publisher for streams
	forwardSubject = "bench.forward.%d"                // stream i's subject
)

// chunkFrame is the session/update line of stream i's chunks, a stamp
// away: the bytes the stack's client reads for a /stamp chunk.
type chunkFrame struct{ head, tail string }

func newChunkFrame(i int) chunkFrame {
	id := fmt.Sprintf("s-%026d", i)
	return chunkFrame{
		head: `{"jsonrpc":"2.0","method":"session/update","params":{"session_id":"` + id + `","sessionId":"` + id + `","text":"`,
		tail: ` ","turn_id":"turn_000000000000000000000000","type":"agent_message_chunk"}}`,
	}
}

// stamped is the frame holding the time it is made.
func (f chunkFrame) stamped() []byte {
	return []byte(f.head + strconv.FormatInt(time.Now().UnixNano(), 10) + f.tail)
}

// servePublisher publishes the streams each request on forwardGo asks
// for ("sessions per pace"), a goroutine a stream as the baseline's
// publisher does, and answers once they are all out.
func servePublisher(url, ready string) {
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "publisher:", err)
		os.Exit(2)
	}
	_, err = nc.Subscribe(forwardGo, func(m *nats.Msg) {
		var sessions, per int
		var pace time.Duration
		if _, err := fmt.Sscan(string(m.Data), &sessions, &per, &pace); err != nil {
			_ = m.Respond([]byte(err.Error()))
			return
		}
		go func() {
			var wg sync.WaitGroup
			for i := range sessions {
				wg.Go(func() {
					f, subject := newChunkFrame(i), fmt.Sprintf(forwardSubject, i)
					for k := range per {
						if k > 0 {
							time.Sleep(pace)
						}
						_ = nc.Publish(subject, f.stamped())
					}
				})
			}
			wg.Wait()
			_ = nc.Flush()
			_ = m.Respond([]byte("done"))
		}()
	})
	if err == nil {
		err = nc.Flush()
	}
	if err == nil {
		err = os.WriteFile(ready, []byte("ready"), 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "publisher:", err)
		os.Exit(2)
	}
	select {} // until the parent goes (exitWithParent)
}

// serveForwarder accepts connections on path; each names its stream in
// its first line, and gets "ok" once the forwarder follows the stream,
// then every message of it, a line each, written by the subscription's
// own goroutine (nats.go gives each subscription one, as it does the
// gateway's).
func serveForwarder(path, url string) {
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "forwarder:", err)
		os.Exit(2)
	}
	// Listened on under another name and renamed: the socket's path
	// appears only once it accepts.
	ln, err := net.Listen("unix", path+".tmp")
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "forwarder:", err)
		os.Exit(2)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go forward(nc, c)
	}
}

// forwardInline, when set (forward_inline_test.go), has the stream's
// messages written on nats.go's reader goroutine instead of the
// subscription's; it is called once the subscription is in place, and
// what it returns when the stream ends.
var forwardInline func(nc *nats.Conn, subject string, c net.Conn) (stop func())

func forward(nc *nats.Conn, c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	i, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		return
	}
	buf := make([]byte, 0, 512) // only the subscription's goroutine writes
	sub, err := nc.Subscribe(fmt.Sprintf(forwardSubject, i), func(m *nats.Msg) {
		buf = append(append(buf[:0], m.Data...), '\n')
		_, _ = c.Write(buf) // a client gone is seen below
	})
	if err != nil {
		return
	}
	defer sub.Unsubscribe()
	_ = sub.SetPendingLimits(-1, -1)
	if forwardInline != nil {
		defer forwardInline(nc, fmt.Sprintf(forwardSubject, i), c)()
	}
	// Nothing is published on the stream before its client has the "ok".
	if nc.Flush() != nil {
		return
	}
	if _, err := c.Write([]byte("ok\n")); err != nil {
		return
	}
	// The client sends nothing more: its end is the stream's.
	_, _ = io.Copy(io.Discard, r)
}

// startForward starts the publisher and the forwarder, each in a child
// process, on the NATS server at url.
func startForward(b *testing.B, url string) (sock string, publisherPID, forwarderPID int) {
	dir := b.TempDir()
	ready, sock := filepath.Join(dir, "publisher.ready"), filepath.Join(dir, "forward.sock")
	publisherPID = startChild(b, publishEnv+"="+ready, forwardNATSEnv+"="+url)
	forwarderPID = startChild(b, forwardEnv+"="+sock, forwardNATSEnv+"="+url)
	testenv.Eventually(b, 15*time.Second, 10*time.Millisecond, func() error {
		if _, err := os.Stat(ready); err != nil {
			return err
		}
		_, err := os.Stat(sock)
		return err
	})
	return sock, publisherPID, forwarderPID
}

// streamForward runs sessions streams through the publisher and the
// forwarder at the stack's pace and reports the chunks' latency as
// streamTurns does.
func streamForward(b *testing.B, url, sock string, sessions int, pace time.Duration, cpu *cpuMeter) {
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	clients := make([]*e2e.Client, sessions)
	for i := range clients {
		c, err := e2e.Dial(sock)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.Send(strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		if line, err := c.ReadLine(15 * time.Second); err != nil || string(line) != "ok" {
			b.Fatalf("forwarder: %q %v", line, err)
		}
		clients[i] = c
	}
	per := max(1, (b.N+sessions-1)/sessions)
	st := newStreamLatency(cpu, sessions, per)
	defer func() {
		for i := range sessions {
			st.window.abandon(i)
		}
	}()
	var wg sync.WaitGroup
	b.ResetTimer()
	wg.Go(func() {
		ask := fmt.Sprintf("%d %d %d", sessions, per, int64(pace))
		m, err := nc.Request(forwardGo, []byte(ask), time.Duration(per)*pace+time.Minute)
		if err == nil && string(m.Data) != "done" {
			err = fmt.Errorf("answered %q", m.Data)
		}
		if err != nil {
			b.Errorf("publisher: %v", err)
		}
	})
	for i, c := range clients {
		wg.Go(func() {
			defer st.window.abandon(i)
			for n := 0; n < per; {
				line, err := c.ReadLine(60 * time.Second)
				if err != nil {
					b.Errorf("read: %v %q", err, line)
					return
				}
				now := time.Now().UnixNano()
				ns, ok, err := chunkStamp(line)
				if err != nil || !ok {
					b.Errorf("line %q: %v", line, err)
					return
				}
				n = st.add(i, now, ns)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	st.report(b)
}
