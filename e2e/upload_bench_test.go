package e2e_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// discardEnv names the socket of the baseline sink, a child process (this
// test binary, re-executed) that reads lines and drops them.
const discardEnv = "CLAWMESH_BENCH_DISCARD_SOCKET"

// benchFileBytes is the benchmark's file: 10 MB, the file limit.
const benchFileBytes = 10 * mib

// BenchmarkUpload measures the throughput of a 10 MB file sent over the
// socket in 1 MiB chunks: file/upload/begin, ten file/upload/chunk and
// file/upload/commit, each awaiting its reply, the file stored and
// indexed in the session's workspace (the first 8 bytes change every
// iteration, so every commit writes). Next to it, in the same run, the
// same lines written to a Unix socket whose server (another process)
// reads and discards them, timed until it has read them all. Reported:
// upload_MB/s, baseline_MB/s, and their ratio (the target is 0.5); and
// where an upload's time went, as the client saw it: begin_ms, chunk_ms
// (one chunk's call) and commit_ms, each a mean. CLAWMESH_BENCH_UPLOAD_SHA256=1
// has every begin declare the file's SHA-256.
func BenchmarkUpload(b *testing.B) {
	sink := startBaseline(b, discardEnv)
	s := e2e.Start(b, e2e.Options{PrivateCluster: true})
	conn, err := net.Dial("unix", s.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	rw := bufio.NewReadWriter(bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10))
	rpc := func(line []byte) []byte {
		if _, err := rw.Write(line); err != nil {
			b.Fatal(err)
		}
		if err := rw.Flush(); err != nil {
			b.Fatal(err)
		}
		reply, err := rw.ReadBytes('\n')
		if err != nil {
			b.Fatal(err)
		}
		if bytes.Contains(reply, []byte(`"error"`)) {
			b.Fatalf("error reply to %.80s: %s", line, reply)
		}
		return reply
	}
	rpc([]byte(`{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":1},"id":0}` + "\n"))
	var created struct {
		Result struct {
			SessionID string `json:"session_id"`
		} `json:"result"`
	}
	if err := json.Unmarshal(rpc([]byte(`{"jsonrpc":"2.0","method":"session/new","params":{},"id":1}`+"\n")), &created); err != nil {
		b.Fatal(err)
	}

	data := make([]byte, benchFileBytes)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	// With CLAWMESH_BENCH_UPLOAD_SHA256=1 each begin declares the file's
	// SHA-256 (computed with the timer stopped), the case in which the
	// content was hashed twice before the sixty-first round; unset, the
	// begin declares none, as make bench has always measured.
	declare := os.Getenv("CLAWMESH_BENCH_UPLOAD_SHA256") == "1"
	beginFor := func(declared string) []byte {
		if declared != "" {
			declared = fmt.Sprintf(`,"sha256":%q`, declared)
		}
		return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"file/upload/begin","params":{"session_id":%q,"size_bytes":%d,"filename":"bench.bin"%s},"id":2}`+"\n",
			created.Result.SessionID, benchFileBytes, declared))
	}
	beginLine := beginFor("")
	// lines are the chunk frames for upload id; the first is rebuilt
	// whenever data's first bytes change.
	chunkLine := func(id string, i int) []byte {
		off := i * mib
		return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"file/upload/chunk","params":{"upload_id":%q,"offset":%d,"data_b64":%q},"id":%d}`+"\n",
			id, off, base64.StdEncoding.EncodeToString(data[off:off+mib]), 3+i))
	}
	commitLine := func(id string) []byte {
		return []byte(fmt.Sprintf(`{"jsonrpc":"2.0","method":"file/upload/commit","params":{"upload_id":%q},"id":99}`+"\n", id))
	}

	// The baseline: the same frames (an upload id of the same length) to
	// the sink, then a sync line it answers once it read everything.
	const fakeID = "0123456789abcdef0123456789abcdef"
	frames := [][]byte{beginLine}
	for i := range benchFileBytes / mib {
		frames = append(frames, chunkLine(fakeID, i))
	}
	frames = append(frames, commitLine(fakeID))
	sc, err := net.Dial("unix", sink)
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	sr := bufio.NewReader(sc)
	baseline := func() time.Duration {
		start := time.Now()
		for _, f := range frames {
			if _, err := sc.Write(f); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := sc.Write([]byte("sync\n")); err != nil {
			b.Fatal(err)
		}
		if _, err := sr.ReadBytes('\n'); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	baseline() // warm
	// upload-staging sleeps until the first file (docs/design.md,
	// "Dormant processes"): woken here, so that the figure is the rate
	// of a running stack, not one start of a process.
	wakeStaging(b, s)

	lines := make([][]byte, benchFileBytes/mib)
	var up, base time.Duration
	// The upload's time by call: the begin, the chunks together and the
	// commit, whose store was the largest part at load (fifty-ninth round).
	var begins, chunks, commits time.Duration
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		binary.BigEndian.PutUint64(data, uint64(n)+uint64(time.Now().UnixNano()))
		if declare {
			sum := sha256.Sum256(data)
			beginLine = beginFor(hex.EncodeToString(sum[:]))
		}
		base += baseline()
		b.StartTimer()

		start := time.Now()
		var begun struct {
			Result struct {
				UploadID string `json:"upload_id"`
			} `json:"result"`
		}
		if err := json.Unmarshal(rpc(beginLine), &begun); err != nil {
			b.Fatal(err)
		}
		id := begun.Result.UploadID
		beginTook := time.Since(start)
		b.StopTimer()
		for i := range lines {
			lines[i] = chunkLine(id, i)
		}
		b.StartTimer()
		chunkStart := time.Now()
		for _, l := range lines {
			rpc(l)
		}
		commitStart := time.Now()
		rpc(commitLine(id))
		end := time.Now()
		up += beginTook + end.Sub(chunkStart)
		begins += beginTook
		chunks += commitStart.Sub(chunkStart)
		commits += end.Sub(commitStart)
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(b.N) * benchFileBytes / 1e6 / d.Seconds() }
	b.ReportMetric(mbps(up), "upload_MB/s")
	b.ReportMetric(mbps(base), "baseline_MB/s")
	b.ReportMetric(mbps(up)/mbps(base), "ratio")
	ms := func(d time.Duration, per int) float64 { return d.Seconds() * 1e3 / float64(b.N*per) }
	b.ReportMetric(ms(begins, 1), "begin_ms")
	b.ReportMetric(ms(chunks, benchFileBytes/mib), "chunk_ms")
	b.ReportMetric(ms(commits, 1), "commit_ms")
}

// serveDiscard reads lines on every connection and drops them; a line
// "sync" is answered "ok", so a writer can tell everything before it was
// read.
func serveDiscard(path string) {
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
			r := bufio.NewReaderSize(c, 64<<10)
			whole := true // the next slice starts a line
			for {
				line, err := r.ReadSlice('\n')
				if err == bufio.ErrBufferFull {
					whole = false
					continue
				}
				if err != nil {
					return
				}
				if whole && string(line) == "sync\n" {
					if _, err := c.Write([]byte("ok\n")); err != nil {
						return
					}
				}
				whole = true
			}
		}()
	}
}
