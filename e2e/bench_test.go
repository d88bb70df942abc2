package e2e_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// BenchmarkSocket measures requests per second and p50/p99 latency over a
// Unix socket, for a raw NDJSON echo server (the baseline: what a socket
// and a line reader cost) and for the gateway's status (one gRPC hop to the
// session service) and health (served inside the gateway), with 1 and 64
// concurrent clients, all in the same run so the ratios mean something.
func BenchmarkSocket(b *testing.B) {
	echo := startEcho(b)
	s := e2e.Start(b, e2e.Options{})
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("echo/clients=%d", clients), func(b *testing.B) {
			runClients(b, echo, clients, false, `{"jsonrpc":"2.0","method":"status","params":{},"id":1}`)
		})
		for _, method := range []string{"health", "status"} {
			b.Run(fmt.Sprintf("%s/clients=%d", method, clients), func(b *testing.B) {
				runClients(b, s.Socket, clients, true, `{"jsonrpc":"2.0","method":"`+method+`","params":{},"id":1}`)
			})
		}
	}
}

func runClients(b *testing.B, socket string, clients int, initialize bool, req string) {
	conns := make([]*bufio.ReadWriter, clients)
	for i := range conns {
		c, err := net.Dial("unix", socket)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		if initialize {
			roundTrip(b, rw, []byte(`{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":1},"id":0}`+"\n"))
		}
		conns[i] = rw
	}
	line := []byte(req + "\n")
	per := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for i := range clients {
		n := b.N / clients
		if i < b.N%clients {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, n)
			for range n {
				t0 := time.Now()
				roundTrip(b, conns[i], line)
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

func roundTrip(b *testing.B, rw *bufio.ReadWriter, line []byte) {
	if _, err := rw.Write(line); err != nil {
		b.Error(err)
		return
	}
	if err := rw.Flush(); err != nil {
		b.Error(err)
		return
	}
	reply, err := rw.ReadBytes('\n')
	if err != nil {
		b.Error(err)
		return
	}
	if bytes.Contains(reply, []byte(`"error"`)) {
		b.Errorf("error reply: %s", reply)
	}
}

const echoEnv = "CLAWMESH_BENCH_ECHO_SOCKET"

// startEcho runs a raw NDJSON echo server in a child process (this test
// binary, re-executed) and returns its socket.
func startEcho(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "echo.sock")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), echoEnv+"="+path)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return path
		}
		if i > 500 {
			b.Fatal("echo server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serveEcho writes back every line it reads, on every connection.
func serveEcho(path string) {
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
			r := bufio.NewReader(c)
			w := bufio.NewWriter(c)
			for {
				line, err := r.ReadBytes('\n')
				if err != nil {
					return
				}
				_, _ = w.Write(line)
				if r.Buffered() == 0 && w.Flush() != nil {
					return
				}
			}
		}()
	}
}
