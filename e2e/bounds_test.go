package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

// rssOf reads a process's resident set from /proc.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	rss, err := readRSS(pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss
}

func readRSS(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read the gateway's status: %w", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmRSS in the gateway's status")
}

// peakRSS samples pid's RSS every 20 ms until stop is closed and then sends the
// highest. A failed read (the gateway gone) fails the test and ends the
// sampling with the peak so far: t.Fatal belongs to the test's goroutine.
func peakRSS(t *testing.T, pid int, stop <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			rss, err := readRSS(pid)
			if err != nil {
				t.Error(err)
				out <- peak
				return
			}
			peak = max(peak, rss)
			select {
			case <-stop:
				out <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// The pipelined-large-replies client of issue 18: hundreds of
// session/messages for a large transcript, sent by a client that never
// reads. The gateway stops reading it at rpc.max_inflight_requests, so it
// holds at most that many replies beside its output queue; healthy
// clients keep being served; the write-stall rule cuts the client.
//
// Documented bound (docs/spec.md §3): (max_inflight_requests + 2)
// replies, each in the three forms a reply passes through in the gateway
// (the service's message, the result value, its JSON), + 2 × the 16 MiB
// output queue + 64 MiB for the runtime.
func TestPipelinedLargeRepliesBounded(t *testing.T) {
	t.Parallel()
	const (
		inflight   = 8
		stallLimit = 2 * time.Second
	)
	s := e2e.Start(t, e2e.Options{Args: []string{
		"--set", "rpc.max_inflight_requests=" + strconv.Itoa(inflight),
		"--set", "rpc.write_stall_timeout_ms=" + strconv.Itoa(int(stallLimit.Milliseconds())),
	}})
	// The healthy clients read ahead of what the test decodes: under the
	// 2 s stall limit, a 1 MB frame decoded under the race detector on a
	// loaded machine left the frames behind it unread that long, and the
	// gateway closed the client that set the transcript up (a read EOF
	// during its prompts).
	v := newConvOn(t, s, s.DialReading(t), nil)
	id := v.newSession("")
	// A transcript of about 6 MB: each turn stores a 1 MB prompt and the
	// scripted provider's 1 MB answer (a line that is no command is said
	// back). A reply is its last page, the largest a page may be: four
	// messages, 4 MiB of content as JSON, their quotes included
	// (docs/spec.md §5).
	word := strings.Repeat("x", mib-2)
	for range 3 {
		v.call("session/prompt", map[string]any{"session_id": id, "prompt": word})
	}
	raw := v.call("session/messages", map[string]any{"session_id": id, "limit": 1000})
	reply := int64(len(raw))
	if reply < 4*mib-8 {
		t.Fatalf("the transcript reply is %d bytes, want a full page of 4 MiB", reply)
	}

	gw := s.PIDOf("gateway")
	before := rssOf(t, gw)
	stop := make(chan struct{})
	peak := peakRSS(t, gw, stop)

	// The attacker: initialize, then 300 requests, never a read after.
	bad, err := net.Dial("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	var frames bytes.Buffer
	frames.WriteString(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocol_version":1}}` + "\n")
	for i := 1; i <= 300; i++ {
		fmt.Fprintf(&frames, `{"jsonrpc":"2.0","id":%d,"method":"session/messages","params":{"session_id":%q,"limit":1000}}`+"\n", i, id)
	}
	if _, err := bad.Write(frames.Bytes()); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()

	// Healthy clients keep being served meanwhile.
	good := s.DialReading(t)
	if _, err := good.Initialize(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, err := good.Call("status", nil); err != nil {
			t.Fatalf("a healthy client's status during the flood: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The write-stall rule closes the attacker. Its socket is never
	// read (a read would count as progress): the test waits for the
	// gateway's close itself, where it slept past the limit before.
	if err := awaitHangUp(bad, 60*time.Second); err != nil {
		t.Fatalf("the non-reading client: %v", err)
	}
	close(stop)
	grown := testwait.Recv(t, peak) - before
	bound := 3*(inflight+2)*reply + 2*16*mib + 64*mib
	t.Logf("gateway RSS %d MiB before, peak growth %d MiB (bound %d MiB, reply %d KiB); closed after the flood was sent",
		before/mib, grown/mib, bound/mib, reply/1024)
	if grown > bound {
		t.Fatalf("gateway RSS grew %d MiB, over the documented bound of %d MiB", grown/mib, bound/mib)
	}
	// The stall rule measured the reader: the gateway gave up within the
	// limit plus a second of its last progress (nothing was ever read),
	// plus the time the replies took to be produced.
	if cut := gatewayCutAfter(t, s, sent); cut > stallLimit+time.Second+5*time.Second {
		t.Fatalf("the write-stall rule cut the client %v after the flood, limit %v", cut, stallLimit)
	}
	if _, err := good.Call("health", nil); err != nil {
		t.Fatalf("a healthy client after the flood: %v", err)
	}
}

// gatewayCutAfter is how long after since the gateway logged closing a
// connection for a write stall.
func gatewayCutAfter(t *testing.T, s *e2e.Stack, since time.Time) time.Duration {
	t.Helper()
	// The launcher copies the gateway's output into its log: a line may
	// land a moment after the close it tells of.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		for _, line := range strings.Split(readLog(t, s, "gateway"), "\n") {
			var entry struct {
				TS  string `json:"ts"`
				Msg string `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &entry) != nil || !strings.Contains(entry.Msg, "write stall") {
				continue
			}
			at, err := time.Parse("2006-01-02T15:04:05.000Z0700", entry.TS)
			if err != nil {
				t.Fatalf("log time %q: %v", entry.TS, err)
			}
			if at.After(since.Add(-time.Second)) {
				return at.Sub(since)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write-stall close in the gateway's log:\n%s", readLog(t, s, "gateway"))
		}
	}
}

// 50 connections holding unfinished frames of 8 MiB − 1 bytes: the
// gateway holds at most rpc.max_buffered_frame_bytes of them, and closing
// them copies nothing. Its resident set stays under the documented bound
// (docs/spec.md §3): the budget, as much again for the Go collector's
// headroom (GOGC=100 lets the heap reach twice what is live before a
// collection), and 64 MiB for the runtime and the connections' small
// buffers.
func TestUnfinishedFramesWithinBudget(t *testing.T) {
	t.Parallel()
	const budget = 128 * mib // the default
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", "rpc.frame_timeout_ms=60000"}})
	gw := s.PIDOf("gateway")
	before := rssOf(t, gw)
	stop := make(chan struct{})
	peak := peakRSS(t, gw, stop)

	frame := bytes.Repeat([]byte("a"), 8*mib-1)
	var conns []net.Conn
	var wg sync.WaitGroup
	var written atomic.Int64
	for range 50 {
		c, err := net.Dial("unix", s.Socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A connection over the budget waits: its write blocks.
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			n, _ := c.Write(frame)
			written.Add(int64(n))
		}()
	}
	wg.Wait()
	// Give the gateway time to read what it will read.
	time.Sleep(time.Second)
	held := rssOf(t, gw) - before
	for _, c := range conns {
		c.Close()
	}
	time.Sleep(2 * time.Second)
	close(stop)
	grown := testwait.Recv(t, peak) - before
	t.Logf("%d MiB sent by 50 connections; gateway RSS +%d MiB while held, peak +%d MiB (budget %d MiB)",
		written.Load()/mib, held/mib, grown/mib, budget/mib)
	if written.Load() < budget {
		t.Fatalf("only %d MiB sent: the test did not reach the budget", written.Load()/mib)
	}
	if bound := 2*budget + 64*mib; grown > int64(bound) {
		t.Fatalf("gateway RSS grew %d MiB, over the documented bound of %d MiB (budget %d MiB)", grown/mib, bound/mib, budget/mib)
	}
	// The gateway still serves.
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatalf("after the unfinished frames: %v", err)
	}
}

// A transcript whose last page is larger than a message between the
// processes may be (16 MiB): session/messages failed for it, whatever
// the limit, and a client could not read back its own session. A page
// now ends before the message that would take it past its byte bound
// (at least one message a page), and the client pages on with
// before_index to the first message.
func TestLargeTranscriptReadInPages(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	id := v.newSession("")
	// Three turns of a 3 MiB prompt and the scripted provider's 3 MiB
	// answer (a line that is no command is said back): about 19 MB.
	var want []int
	for i := range 3 {
		word := strings.Repeat(string(rune('a'+i)), 3*mib)
		v.call("session/prompt", map[string]any{"session_id": id, "prompt": word})
		want = append(want, len(word), len(word))
	}
	var got []int
	for _, m := range readMessagePages(t, v, id, len(want)) {
		got = append(got, len(m.Content))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("message sizes read back %v, want %v", got, want)
	}

	// Collie: the durable bridge shows the session's pane (it read the
	// transcript's last page, which failed the same way, and left the
	// pane out), and pages through its items to the last.
	c := phone(t, s)
	pollUntil(t, c, "the large session's pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })
	var kinds []string
	query := "limit=1000"
	for pages := 0; ; pages++ {
		if pages > len(want) {
			t.Fatalf("more item pages than messages")
		}
		r, err := c.Items(context.Background(), id, query)
		if err != nil {
			t.Fatal(err)
		}
		var items struct {
			Items []struct{ Kind string }
			Next  *string
		}
		if r.Status != http.StatusOK || r.JSON(&items) != nil || len(items.Items) == 0 {
			t.Fatalf("items %q: %s", query, r)
		}
		for _, it := range items.Items {
			kinds = append(kinds, it.Kind)
		}
		if items.Next == nil {
			break
		}
		query = "limit=1000&after=" + *items.Next
	}
	if fmt.Sprint(kinds) != "[user reply user reply user reply]" {
		t.Fatalf("items read back: %v", kinds)
	}
}

// Three 6 MiB system prompts, each one a set-many within the frame limit,
// made a config no process could read whole: the services lost it, and
// the next clawmesh up never came up (plugin-sandbox: "read the live
// config: ... larger than max"). Each is refused now, and the stack
// starts again on the same data directory with what was kept.
func TestConfigPastItsBoundRefusedAndTheStackStartsAgain(t *testing.T) {
	t.Parallel()
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir})
	op := newConv(t, s, nil)
	big := strings.Repeat("p", 6<<20)
	for _, a := range []string{"a", "b", "c"} {
		_, f := op.until(op.send("config/set-many", map[string]any{"sets": []map[string]any{{"prop": "agents." + a + ".system_prompt", "value": big}}}))
		if f.Error == nil || f.Error.Code != -32602 || !strings.Contains(f.Error.Message, "; the limit is 4194304") {
			t.Fatalf("a 6 MiB system prompt for agent %s: %+v", a, f.Error)
		}
	}
	op.call("config/set-many", map[string]any{"sets": []map[string]any{{"prop": "agents.a.system_prompt", "value": strings.Repeat("p", mib)}}})
	s.Stop()

	s = e2e.Start(t, e2e.Options{DataDir: dir})
	op = newConv(t, s, nil)
	op.newSession("a")
}

// A page of transcript is bounded by its content's bytes, but a client
// reads it as JSON, where a '<' or a control character takes six: three
// prompts of 1.3 MiB of '<' (each a frame of 7.8 MiB) and their answers
// made a session/messages page of 23.6 MiB, three times the frame a
// client reads. A page is now bounded as JSON, and every message reads
// back whole, in pages a client can read.
func TestTranscriptPageBoundedAsJSON(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, nil)
	id := v.newSession("")
	var want []int
	for range 3 {
		word := strings.Repeat("<", 1300<<10)
		_, f := v.until(v.send("session/prompt", map[string]any{"session_id": id, "prompt": word}))
		if f.Error != nil {
			t.Fatalf("prompt: %v", f.Error)
		}
		want = append(want, len(word), -1)
	}
	var got []int
	for _, m := range readMessagePages(t, v, id, len(want)) {
		n := len(m.Content)
		if m.Role == "assistant" {
			n = -1 // the answer said back is cut at the reply's bound
		}
		got = append(got, n)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("message sizes read back %v, want %v", got, want)
	}
}

// A message of more than 16 MiB, which a stack before the page and reply
// bounds could store, left its session's page unreadable for good
// (session/messages failed whatever its limit), and the durable bridge,
// which reads each open session's last page when it wakes, never became
// ready. Such a message is now read cut to what a frame carries, and says
// so.
func TestMessagePastEveryBoundReadsCut(t *testing.T) {
	t.Parallel()
	s, _, db := durableStack(t)
	v := newConv(t, s, nil)
	id := v.newSession("")
	v.call("session/prompt", map[string]any{"session_id": id, "prompt": "hello"})
	ctx := e2e.Context(t, 30*time.Second)
	if _, err := db.Exec(ctx, "UPDATE session.messages SET content = repeat('w', 17 << 20), json_size = NULL WHERE session_id = $1 AND idx = 0", id); err != nil {
		t.Fatal(err)
	}
	// The last page ends before the large message (the answer to it,
	// said back, is the page); the next page is the large message alone.
	msgs := readMessagePages(t, v, id, 2)
	if len(msgs) != 2 {
		t.Fatalf("%d messages read back", len(msgs))
	}
	got := msgs[0].Content
	if !strings.HasPrefix(got, "wwww") || !strings.HasSuffix(got, "bytes shown]") || !strings.Contains(got, fmt.Sprintf("of its %d bytes", 17<<20)) {
		t.Fatalf("the large message read back: %d bytes ending %q", len(got), got[max(0, len(got)-80):])
	}

	c := phone(t, s)
	pollUntil(t, c, "the session's pane", func(s *collietest.Snapshot) bool { return s.Pane(id) != nil })
}

// pageMessage is a message of a session/messages page.
type pageMessage struct {
	Index   int64  `json:"index"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

// readMessagePages reads a session's whole transcript with
// session/messages, from the last page back, each page within the frame a
// client reads and the total the n messages expected; oldest first.
func readMessagePages(t *testing.T, v *conv, id string, n int) []pageMessage {
	t.Helper()
	var out []pageMessage
	params := map[string]any{"session_id": id, "limit": 1000}
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatalf("more pages than messages")
		}
		_, f := v.until(v.send("session/messages", params))
		if f.Error != nil {
			t.Fatalf("session/messages %v: %v", params, f.Error)
		}
		if len(f.Result) > 8*mib {
			t.Fatalf("a page of %d bytes of JSON: past the frame a client reads", len(f.Result))
		}
		var p struct {
			Messages []pageMessage `json:"messages"`
			Total    int64         `json:"total"`
		}
		if err := json.Unmarshal(f.Result, &p); err != nil {
			t.Fatal(err)
		}
		if p.Total != int64(n) || len(p.Messages) == 0 {
			t.Fatalf("page %d: total %d, %d messages", pages, p.Total, len(p.Messages))
		}
		out = append(p.Messages, out...)
		if p.Messages[0].Index == 0 {
			return out
		}
		params["before_index"] = p.Messages[0].Index
	}
}
