// Package padecho is the benchmarks' echo of a line protocol: the
// baseline the gateway's NDJSON path is read against, in e2e as a
// process of its own and in gateway/jsonrpc in the benchmark's process,
// one loop in both so that their figures compare.
//
// It is for tests and benchmarks only; no binary imports it.
package padecho

import (
	"bufio"
	"bytes"
	"io"
)

// Serve writes back every line it reads from rw, padded with spaces to
// replyBytes when a line is shorter (a reply the size of the gateway's),
// and flushes once no more input is buffered, so a pipelined client's
// replies go out together as the gateway's do. It returns when a read or
// a flush fails: the peer's end.
func Serve(rw io.ReadWriter, replyBytes int) {
	pad := bytes.Repeat([]byte(" "), replyBytes)
	r := bufio.NewReader(rw)
	w := bufio.NewWriter(rw)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		if short := replyBytes - len(line); short > 0 {
			_, _ = w.Write(line[:len(line)-1])
			_, _ = w.Write(pad[:short])
			_ = w.WriteByte('\n')
		} else {
			_, _ = w.Write(line)
		}
		if r.Buffered() == 0 && w.Flush() != nil {
			return
		}
	}
}
