package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/padecho"
	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// BenchmarkSocket measures requests per second and p50/p99 latency over a
// Unix socket, for a raw NDJSON echo server (the baseline: what a socket
// and a line reader cost) and for the gateway's status (one gRPC hop to the
// session service) and health (served inside the gateway), with 1 and 64
// concurrent clients, all in the same run so the ratios mean something.
//
// session_state is session/state of one session (of the same local
// principal), a read that crosses one gRPC hop to the session service.
//
// grpc_bare is no request over the socket: 64 goroutines calling health
// Check on a bare gRPC server in another process (internal/e2e/baselinegrpc)
// over one client connection made as the gateway makes its own
// (grpcclient.Dial). It is what a gRPC hop between two processes gives on
// the machine, for status and session/state to be read against.
//
// echo_sized is the echo server answering each line with one as long as
// health's reply (about 900 bytes of the fields docs/spec.md §5 names,
// against the echo's 55): what a socket and a line reader cost for
// replies of that size, so health's figure can be read against both.
//
// Each row also reports server_cpu_us/op, the CPU time (user and system)
// the serving process (the echo child, or the gateway) spent per request
// over the timed run, and client_cpu_us/op, this process's: on a machine
// other work loads, req/s moves by a quarter from one run to the next,
// while what a request costs each side moves far less, and a change to the
// gateway's path shows in its own figure.
func BenchmarkSocket(b *testing.B) {
	echo, echoPID := startEchoPID(b)
	_, bareGRPC := startBaselineGRPC(b)
	s := e2e.Start(b, e2e.Options{PrivateCluster: true})
	owner := s.Dial(b)
	if _, err := owner.Initialize(); err != nil {
		b.Fatal(err)
	}
	const healthLine = `{"jsonrpc":"2.0","method":"health","params":{},"id":1}`
	sized, sizedPID := startBaselinePID(b, echoEnv, fmt.Sprintf("%s=%d", echoReplyEnv, replyLen(b, s.Socket, healthLine)))
	gatewayPID := s.PIDOf("gateway")
	raw, err := owner.Call("session/new", map[string]any{})
	if err != nil {
		b.Fatal(err)
	}
	var created struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(raw, &created); err != nil || created.SessionID == "" {
		b.Fatalf("session/new: %s %v", raw, err)
	}
	requests := []struct{ name, line string }{
		{"health", healthLine},
		{"status", `{"jsonrpc":"2.0","method":"status","params":{},"id":1}`},
		{"session_state", stateLine(created.SessionID)},
	}
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("echo/clients=%d", clients), func(b *testing.B) {
			runClients(b, echo, echoPID, clients, false, `{"jsonrpc":"2.0","method":"status","params":{},"id":1}`)
		})
		if clients > 1 {
			b.Run(fmt.Sprintf("echo_sized/clients=%d", clients), func(b *testing.B) {
				runClients(b, sized, sizedPID, clients, false, healthLine)
			})
		}
		for _, r := range requests {
			b.Run(fmt.Sprintf("%s/clients=%d", r.name, clients), func(b *testing.B) {
				runClients(b, s.Socket, gatewayPID, clients, true, r.line)
			})
		}
	}
	b.Run("grpc_bare/clients=64", func(b *testing.B) { runGRPCCallers(b, bareGRPC, 64) })
	// session_state_apart: each client reads a session of its own, so no
	// two reads are ever shared and every request makes its own gRPC call.
	// Its sessions are made last: status lists every open session.
	var apart []string
	b.Run("session_state_apart/clients=64", func(b *testing.B) {
		for len(apart) < 64 {
			raw, err := owner.Call("session/new", map[string]any{})
			if err != nil {
				b.Fatal(err)
			}
			var c struct {
				SessionID string `json:"session_id"`
			}
			if err := json.Unmarshal(raw, &c); err != nil {
				b.Fatal(err)
			}
			apart = append(apart, stateLine(c.SessionID))
		}
		runClientsEach(b, s.Socket, gatewayPID, true, apart)
	})
}

func stateLine(sessionID string) string {
	return `{"jsonrpc":"2.0","method":"session/state","params":{"session_id":"` + sessionID + `"},"id":1}`
}

// runClients runs clients connections each sending req, one at a time;
// server is the pid of the process serving socket (0: not measured).
func runClients(b *testing.B, socket string, server, clients int, initialize bool, req string) {
	reqs := make([]string, clients)
	for i := range reqs {
		reqs[i] = req
	}
	runClientsEach(b, socket, server, initialize, reqs)
}

// runClientsEach runs one connection per request line, each sending its
// line, one at a time, b.N requests in all; server is the pid of the
// process serving socket, whose CPU a request is reported (0: none).
func runClientsEach(b *testing.B, socket string, server int, initialize bool, reqs []string) {
	clients := len(reqs)
	conns := make([]*bufio.ReadWriter, clients)
	for i := range conns {
		c, err := net.Dial("unix", socket)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		if initialize {
			if _, err := roundTrip(rw, initLine); err != nil {
				b.Fatal(err)
			}
		}
		conns[i] = rw
	}
	lines := make([][]byte, clients)
	for i, r := range reqs {
		lines[i] = []byte(r + "\n")
	}
	stop := meterCPU(b, server)
	runCallers(b, clients, func(i int) error {
		_, err := roundTrip(conns[i], lines[i])
		return err
	})
	stop()
}

// meterCPU starts counting the CPU time spent by process server (when
// not 0) and by this process; the function it returns reports each per
// request of b.N, as server_cpu_us/op and client_cpu_us/op. Called after
// the connections are made, so that only the requests are counted.
func meterCPU(b *testing.B, server int) (stop func()) {
	read := func() (srv, self time.Duration, ok bool) {
		me, err := procstat.Self()
		if err != nil {
			return 0, 0, false
		}
		if server == 0 {
			return 0, me.CPU, true
		}
		st, err := procstat.Read(server)
		if err != nil {
			return 0, 0, false
		}
		return st.CPU, me.CPU, true
	}
	srv0, self0, ok := read()
	return func() {
		srv1, self1, ok1 := read()
		if !ok || !ok1 || b.N == 0 {
			return
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
		if server != 0 {
			b.ReportMetric(per(srv1-srv0), "server_cpu_us/op")
		}
		b.ReportMetric(per(self1-self0), "client_cpu_us/op")
	}
}

// runGRPCCallers runs callers goroutines calling health Check on the gRPC
// server at sock over one client connection, b.N calls in all.
func runGRPCCallers(b *testing.B, sock string, callers int) {
	cc, err := grpcclient.Dial(sock)
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx := context.Background()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		b.Fatal(err) // connected before the clock starts
	}
	runCallers(b, callers, func(int) error {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
}

// runCallers runs callers goroutines, each calling call one call at a
// time, b.N calls in all, and reports their rate and latency; a caller
// stops at its first error.
func runCallers(b *testing.B, callers int, call func(i int) error) {
	per := make([][]time.Duration, callers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := range callers {
		n := b.N / callers
		if i < b.N%callers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, n)
			for range n {
				t0 := time.Now()
				if err := call(i); err != nil {
					b.Error(err)
					break
				}
				lat = append(lat, time.Since(t0))
			}
			per[i] = lat
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var all []time.Duration
	for _, l := range per {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50_us")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99_us")
}

// replyLen is the length of the reply to line (its LF included) on a
// fresh, initialized connection to socket.
func replyLen(b *testing.B, socket, line string) int {
	c, err := net.Dial("unix", socket)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
	if _, err := roundTrip(rw, initLine); err != nil {
		b.Fatal(err)
	}
	reply, err := roundTrip(rw, []byte(line+"\n"))
	if err != nil {
		b.Fatal(err)
	}
	return len(reply)
}

// roundTrip writes line and reads one reply; an error reply is an error
// too, so that a failing client stops instead of timing failures.
func roundTrip(rw *bufio.ReadWriter, line []byte) ([]byte, error) {
	if _, err := rw.Write(line); err != nil {
		return nil, err
	}
	if err := rw.Flush(); err != nil {
		return nil, err
	}
	reply, err := rw.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	if bytes.Contains(reply, []byte(`"error"`)) {
		return reply, fmt.Errorf("error reply: %s", reply)
	}
	return reply, nil
}

// initLine initializes a benchmark client's connection.
var initLine = []byte(`{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":1},"id":0}` + "\n")

const echoEnv = "CLAWMESH_BENCH_ECHO_SOCKET"

// echoReplyEnv, when set, makes the echo server pad each reply with
// spaces before its LF to that many bytes (LF included).
const echoReplyEnv = "CLAWMESH_BENCH_ECHO_REPLY_BYTES"

// startEcho runs a raw NDJSON echo server in a child process (this test
// binary, re-executed) and returns its socket.
func startEcho(b *testing.B) string { return startBaseline(b, echoEnv) }

// startEchoPID is startEcho that also returns the server's pid.
func startEchoPID(b *testing.B) (string, int) { return startBaselinePID(b, echoEnv) }

// startBaseline runs a baseline server in a child process (see
// startChild) with env naming the socket it serves, and extra as more of
// its environment, and returns the socket once it accepts.
func startBaseline(b *testing.B, env string, extra ...string) string {
	path, _ := startBaselinePID(b, env, extra...)
	return path
}

// startBaselinePID is startBaseline that also returns the server's pid.
func startBaselinePID(b *testing.B, env string, extra ...string) (string, int) {
	path := filepath.Join(b.TempDir(), "baseline.sock")
	pid := startChild(b, append([]string{env + "=" + path}, extra...)...)
	testenv.Eventually(b, 15*time.Second, 10*time.Millisecond, func() error {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
		}
		return err
	})
	return path, pid
}

const natsEnv = "CLAWMESH_BENCH_NATS_URL_FILE"

// startNATS runs a NATS server in a child process (see startChild) and
// returns its client URL.
func startNATS(b *testing.B) (url string, pid int) {
	file := filepath.Join(b.TempDir(), "nats.url")
	pid = startChild(b, natsEnv+"="+file)
	var raw []byte
	testenv.Eventually(b, 15*time.Second, 10*time.Millisecond, func() (err error) {
		raw, err = os.ReadFile(file)
		return err
	})
	return string(raw), pid
}

// startChild re-executes this test binary with env added to its
// environment, which names the server TestMain runs in it. The child's
// stdin is a pipe only this process holds: it ends when the test's or
// benchmark's cleanup closes it, or when this process dies however it dies, and the
// child then exits (exitWithParent), so no child outlives its test.
func startChild(b testing.TB, env ...string) (pid int) {
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin, cmd.Stderr = r, os.Stderr
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// exitWithParent ends this child process once its stdin ends (startChild),
// having called stop (a profile's, to write it) when there is one.
func exitWithParent(stop func() error) {
	_, _ = io.Copy(io.Discard, os.Stdin)
	if stop != nil {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, "profile:", err)
		}
	}
	os.Exit(0)
}

// serveNATS runs a NATS server on a loopback port and writes its client
// URL to file once it accepts connections; it serves until the process
// ends (exitWithParent).
func serveNATS(file string) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats-server:", err)
		os.Exit(2)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) { // startNATS waits 15 s
		fmt.Fprintln(os.Stderr, "nats-server: not ready")
		os.Exit(2)
	}
	err = os.WriteFile(file+".tmp", []byte(srv.ClientURL()), 0o600)
	if err == nil {
		err = os.Rename(file+".tmp", file)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats-server: URL not written:", err)
		os.Exit(2)
	}
	srv.WaitForShutdown()
}

// serveEcho writes back every line it reads, on every connection; padded
// with spaces to replyBytes when a line is shorter.
func serveEcho(path string, replyBytes int) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		os.Exit(2)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			padecho.Serve(c, replyBytes)
		}()
	}
}

// turnStreamPace is the interval between two chunks of one session in
// BenchmarkTurnStream, for the stack and the bare NATS baseline alike.
//
// The default, 5 ms, is 200 chunks a second a session, 20 000 a second at
// 100 sessions. Hosted models stream about 30 to 150 tokens a second to
// one session, in chunks of one token or a few: a chunk every 7 ms or
// more. 5 ms is a third faster than the fastest of those, at 100 sessions
// at once on one host. The pace before, 1 ms (1000 chunks a second a
// session, 100 000 a second at 100 sessions), is 7 to 33 times what such
// a provider sends; only a model on dedicated inference hardware streams
// a token a millisecond, and 100 of those at once is not the load of a
// daemon on one user's machine. It stays available, to see the stack past
// its capacity: -turnstream.pace=1ms (whole milliseconds: the scripted
// provider's /stamp takes its gap in ms).
var turnStreamPace = flag.Duration("turnstream.pace", 5*time.Millisecond,
	"BenchmarkTurnStream: interval between two chunks of one session (whole ms)")

// BenchmarkTurnStream measures the time from the provider producing a
// chunk to the client reading it off the socket (the scripted provider's
// /stamp writes the production time into each chunk; both ends share this
// host's clock), with 1, 10 and 100 sessions streaming at once, one chunk
// per turnStreamPace each. Next to it, in the same run and on the same
// NATS server, a bare NATS publish-to-receive at the same pace and
// fan-in, of a message holding the same bytes as the update frame the
// client reads; both readers find the stamp in those bytes the same way
// (chunkStamp), so the comparison is of the transports, not of two
// decoders.
//
// The NATS server runs in a process of its own, as it does in a stack
// (where the launcher holds it): a bare publish then crosses from the
// publisher's process to the server's and back, as a NATS message between
// two services does. nats-inproc, for scale, is the same baseline with
// publisher, server and subscriber in this one process, where a message
// never leaves it (the baseline until the fifth round of issue 17).
func BenchmarkTurnStream(b *testing.B) {
	pace := *turnStreamPace
	if pace < time.Millisecond || pace%time.Millisecond != 0 {
		b.Fatalf("-turnstream.pace %v: a whole number of milliseconds is needed", pace)
	}
	natsURL, natsPID := startNATS(b)
	inproc := testenv.NATS(b)
	// CLAWMESH_BENCH_STACK_ENV adds variables to the stack's processes
	// alone (GOMAXPROCS=1, say), not to this one's nor the NATS server's.
	s := e2e.Start(b, e2e.Options{PrivateCluster: true,
		Env: append([]string{"NATS_URL=" + natsURL}, strings.Fields(os.Getenv("CLAWMESH_BENCH_STACK_ENV"))...)})
	// cpu_us/chunk at 100 sessions: the CPU of every process a chunk
	// crosses, this one (the client, or the baseline's publisher and
	// subscriber) included, while every session streams (streamWindow).
	// With fewer sessions the processes are idle most of
	// the time and the figure would be mostly their idle work.
	stackCPU := &cpuMeter{self: "client", pids: func() map[int]string {
		pids := s.PIDs()
		pids[natsPID], pids[s.LauncherPID()] = "nats-server", "launcher"
		return pids
	}}
	natsCPU := &cpuMeter{self: "pubsub", pids: func() map[int]string {
		return map[int]string{natsPID: "nats-server"}
	}}
	// In nats-inproc the server is in this process too: nothing else to read.
	inprocCPU := &cpuMeter{self: "pubsub", pids: func() map[int]string { return nil }}
	metered := func(n int, m *cpuMeter) *cpuMeter {
		if n < 100 {
			return nil
		}
		return m
	}
	sock, publisherPID, forwarderPID := startForward(b, natsURL)
	forwardCPU := &cpuMeter{self: "client", pids: func() map[int]string {
		return map[int]string{natsPID: "nats-server", publisherPID: "publisher", forwarderPID: "forwarder"}
	}}
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("socket/sessions=%d", n), func(b *testing.B) { streamTurns(b, s, n, pace, metered(n, stackCPU)) })
		b.Run(fmt.Sprintf("nats/sessions=%d", n), func(b *testing.B) { streamNATS(b, natsURL, n, pace, metered(n, natsCPU)) })
		if n != 10 {
			b.Run(fmt.Sprintf("nats-inproc/sessions=%d", n), func(b *testing.B) { streamNATS(b, inproc, n, pace, metered(n, inprocCPU)) })
			// The stack's path with nothing done on it (forward_bench_test.go).
			b.Run(fmt.Sprintf("forward/sessions=%d", n), func(b *testing.B) { streamForward(b, natsURL, sock, n, pace, metered(n, forwardCPU)) })
		}
	}
	// The rows above are a fresh stack's, whose durable bridge sleeps
	// until a Collie connects. Once one has, the bridge follows every
	// update too: the same streams with it awake, for scale.
	phone(b, s) // wakes the bridge
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("socket-bridge/sessions=%d", n), func(b *testing.B) { streamTurns(b, s, n, pace, metered(n, stackCPU)) })
	}
}

var (
	updateMethod = []byte(`"method":"session/update"`)
	chunkType    = []byte(`"type":"agent_message_chunk"`)
	textKey      = []byte(`"text":"`)
)

// chunkStamp finds the production time in a session/update frame of an
// agent_message_chunk whose text is a /stamp chunk ("<unix ns> "); ok is
// false for any other update.
func chunkStamp(frame []byte) (ns int64, ok bool, err error) {
	if !bytes.Contains(frame, chunkType) {
		return 0, false, nil
	}
	i := bytes.Index(frame, textKey)
	if i < 0 {
		return 0, false, fmt.Errorf("chunk without text: %q", frame)
	}
	digits := frame[i+len(textKey):]
	n := 0
	for n < len(digits) && digits[n] >= '0' && digits[n] <= '9' {
		n++
	}
	ns, err = strconv.ParseInt(string(digits[:n]), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("chunk %q: %w", frame, err)
	}
	return ns, true, nil
}

func streamTurns(b *testing.B, s *e2e.Stack, sessions int, pace time.Duration, cpu *cpuMeter) {
	type client struct {
		c  *e2e.Client
		id string
	}
	clients := make([]client, sessions)
	for i := range clients {
		c := s.Dial(b)
		if _, err := c.Initialize(); err != nil {
			b.Fatal(err)
		}
		raw, err := c.Call("session/new", map[string]any{})
		if err != nil {
			b.Fatal(err)
		}
		var r struct {
			SessionID string `json:"session_id"`
		}
		json.Unmarshal(raw, &r)
		clients[i] = client{c, r.SessionID}
	}
	per := max(1, (b.N+sessions-1)/sessions)
	var wg sync.WaitGroup
	b.ResetTimer()
	st := newStreamLatency(cpu, sessions, per)
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer st.window.abandon(i)
			params, _ := json.Marshal(map[string]any{"session_id": cl.id, "prompt": fmt.Sprintf("/stamp %d %d", per, pace.Milliseconds())})
			if err := cl.c.Send(`{"jsonrpc":"2.0","id":"p","method":"session/prompt","params":` + string(params) + `}`); err != nil {
				b.Error(err)
				return
			}
			for {
				line, err := cl.c.ReadLine(60 * time.Second)
				if err != nil {
					b.Errorf("read: %v %q", err, line)
					return
				}
				now := time.Now().UnixNano()
				if !bytes.Contains(line, updateMethod) {
					// Anything else is rare (the prompt's response ends
					// the turn): decoded in full.
					var f e2e.Frame
					if err := json.Unmarshal(line, &f); err != nil {
						b.Errorf("frame %q: %v", line, err)
						return
					}
					if string(f.ID) == `"p"` {
						return
					}
					continue
				}
				ns, ok, err := chunkStamp(line)
				if err != nil {
					b.Error(err)
					return
				}
				if ok {
					st.add(i, now, ns)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	st.report(b)
	// A principal keeps at most 1,000 sessions open, and each run of this
	// function (b.N's ramp, every count) makes its own on one stack.
	for _, cl := range clients {
		if _, err := cl.c.Call("session/close", map[string]any{"session_id": cl.id}); err != nil {
			b.Fatalf("session/close: %v", err)
		}
	}
}

func streamNATS(b *testing.B, url string, sessions int, pace time.Duration, cpu *cpuMeter) {
	pub, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	sub, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	per := max(1, (b.N+sessions-1)/sessions)
	done := make([]chan struct{}, sessions)
	st := newStreamLatency(cpu, sessions, per)
	// Ends the window's wait if the set-up below fails (b.Fatal); after a
	// run each session has ended it already.
	defer func() {
		for i := range sessions {
			st.window.abandon(i)
		}
	}()
	for i := range sessions {
		done[i] = make(chan struct{})
		s, err := sub.Subscribe(fmt.Sprintf("bench.stream.%d", i), func(m *nats.Msg) {
			now := time.Now().UnixNano()
			if !bytes.Contains(m.Data, updateMethod) {
				b.Errorf("message %q", m.Data)
				return
			}
			ns, ok, err := chunkStamp(m.Data)
			if err != nil || !ok {
				b.Errorf("message %q: %v", m.Data, err)
				return
			}
			if st.add(i, now, ns) == per {
				close(done[i])
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Unsubscribe()
	}
	// Every subscription is known to the server before anything is sent.
	if err := sub.Flush(); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer st.window.abandon(i)
			// The bytes of the update frame the stack's client reads.
			f, subject := newChunkFrame(i), fmt.Sprintf("bench.stream.%d", i)
			for k := range per {
				if k > 0 {
					time.Sleep(pace)
				}
				pub.Publish(subject, f.stamped())
			}
			select {
			case <-done[i]:
			case <-time.After(60 * time.Second):
				b.Errorf("stream %d: received %d of %d", i, len(st.lat[i]), per)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	st.report(b)
}

// streamLatency holds a turn-stream benchmark's chunk latencies, by
// stream, and the CPU window over them.
type streamLatency struct {
	lat    [][]time.Duration
	window *streamWindow
}

func newStreamLatency(cpu *cpuMeter, sessions, per int) *streamLatency {
	return &streamLatency{lat: make([][]time.Duration, sessions), window: openWindow(cpu, sessions, per)}
}

// add records a chunk of stream i stamped ns and read at now; it returns
// the chunks stream i has had.
func (st *streamLatency) add(i int, now, ns int64) int {
	st.lat[i] = append(st.lat[i], time.Duration(now-ns))
	st.window.chunk(i)
	return len(st.lat[i])
}

// report reports the chunks' p50 and p99, and the CPU they cost.
func (st *streamLatency) report(b *testing.B) {
	reportLatency(b, st.lat)
	st.window.report(b)
}

// reportLatency reports the chunks' p50 and p99.
func reportLatency(b *testing.B, per [][]time.Duration) {
	var all []time.Duration
	for _, l := range per {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50_us")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99_us")
}
