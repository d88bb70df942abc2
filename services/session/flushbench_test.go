package session

import (
	"strconv"
	"testing"
)

// BenchmarkCheckpointGather is the writer's work on one batch of the
// turn stream at 100 sessions, the database aside: 100 running turns
// with 20 chunks pending each (100 ms at one chunk each 5 ms), their
// events taken and laid out as insertEvents' columns.
func BenchmarkCheckpointGather(b *testing.B) {
	cp := &checkpointer{maxBytes: DefaultCheckpointBytes, logs: map[*turnLog]struct{}{},
		wake: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	var logs []*turnLog
	for i := range 100 {
		logs = append(logs, cp.open("s_"+strconv.Itoa(i), "t_"+strconv.Itoa(i), "cli", 1))
	}
	chunk := "1796357943194065258 "
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range logs {
			for range 20 {
				l.stream(0, false, chunk, 0)
			}
		}
		n := gatherForBench(cp)
		if n != len(logs) {
			b.Fatalf("%d events gathered, want %d", n, len(logs))
		}
	}
}

// gatherForBench is flush's work before its statement.
func gatherForBench(c *checkpointer) int {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, all := c.gather()
	defer c.release()
	c.cols.fill(all)
	return len(c.cols.sid)
}
