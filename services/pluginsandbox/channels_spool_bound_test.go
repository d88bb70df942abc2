package pluginsandbox_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// bigMessage is a message of about 200 kB: counted as 49 blocks of 4 KiB
// by the spool's bound, five fit 1 MiB and a sixth does not.
func bigMessage(id string) string {
	return `{"id":"` + id + `","from":"ann","text":"` + id + strings.Repeat("x", 200_000) + `"}`
}

// spoolAnswer is a post's status, Retry-After and body.
type spoolAnswer struct {
	code       int
	retryAfter string
	body       string
}

func postAnswer(t *testing.T, addr, body string) spoolAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+chanToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return spoolAnswer{resp.StatusCode, resp.Header.Get("Retry-After"), string(text)}
}

// keptFiles counts the messages kept anywhere under spool.
func keptFiles(t *testing.T, spool string) int {
	t.Helper()
	n := 0
	_ = filepath.WalkDir(spool, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".msg") {
			n++
		}
		return nil
	})
	return n
}

// fullMark is the path of the mark the spool of web for webhook keeps
// while it refuses for its bound.
func fullMark(spool string) string {
	return filepath.Join(spool, hex.EncodeToString([]byte("web")), "p-"+hex.EncodeToString([]byte("webhook")), "full")
}

// wantRefusedForTheBound posts a big message and wants the bound's 503.
func wantRefusedForTheBound(t *testing.T, addr, id string) {
	t.Helper()
	a := postAnswer(t, addr, bigMessage(id))
	if a.code != http.StatusServiceUnavailable || a.retryAfter == "" ||
		!strings.Contains(a.body, "at its bound, 1 MiB (channels.plugin.web.spool_max_mb)") {
		t.Fatalf("%s past the spool's bound: %d, Retry-After %q, %q; want 503 naming the bound", id, a.code, a.retryAfter, a.body)
	}
}

// drainedTakesAgain waits for the spool to take a message again once
// its turns ran.
func drainedTakesAgain(t *testing.T, addr, spool, id string) {
	t.Helper()
	testenv.Eventually(t, testwait.Bound, 20*time.Millisecond, func() error {
		if a := postAnswer(t, addr, bigMessage(id)); a.code != http.StatusAccepted {
			return fmt.Errorf("post once drained: %d %q", a.code, a.body)
		}
		return nil
	})
	if _, err := os.Lstat(fullMark(spool)); !os.IsNotExist(err) {
		t.Fatalf("the at-the-bound mark once the spool took a message again: %v", err)
	}
}

// A channel's spool had no bound on disk: a sender holding the token
// filled it as long as the messages waited (a held turn here; a plugin
// never bound again, replicas that die). Past channels.plugin.<alias>.
// spool_max_mb a message is refused before it is taken (503, Retry-After,
// the setting named), nothing answered 202 is dropped, and the spool takes
// messages again once delivery brought it below.
func TestChannelSpoolRefusesPastItsBoundUntilDrained(t *testing.T) {
	fs := newFakeSessions()
	hold := make(chan struct{}) // m1's turn holds its conversation: all stay on disk
	fs.hold = hold
	spool := t.TempDir()
	ts := channelServerHook(t, fs, "http://127.0.0.1:1/", func(c *pluginsandbox.Config) { c.ChannelSpoolDir = spool })
	web := bindChannels(t, ts, pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", SpoolMaxMB: 1})["web"]
	for i := 1; i <= 5; i++ {
		if a := postAnswer(t, web.Listen, bigMessage(fmt.Sprintf("m%d", i))); a.code != http.StatusAccepted {
			t.Fatalf("m%d under the bound: %d %q", i, a.code, a.body)
		}
	}
	wantRefusedForTheBound(t, web.Listen, "m6")
	wantRefusedForTheBound(t, web.Listen, "m7")
	if n := keptFiles(t, spool); n != 5 {
		t.Fatalf("%d messages kept, want the 5 taken", n)
	}
	if _, err := os.Lstat(fullMark(spool)); err != nil {
		t.Fatalf("no at-the-bound mark for status: %v", err)
	}
	close(hold)
	seen := map[string]bool{}
	for range 5 {
		seen[testwait.Recv(t, fs.prompts).prompt[:2]] = true
	}
	if len(seen) != 5 || !seen["m1"] || !seen["m5"] {
		t.Fatalf("delivered %v, want m1..m5", seen)
	}
	drainedTakesAgain(t, web.Listen, spool, "m8")
	if p := testwait.Recv(t, fs.prompts); p.prompt[:2] != "m8" {
		t.Fatalf("next prompt %q, want m8", p.prompt[:2])
	}
}

// The bound counts what is on disk, not what this process wrote: a
// replica that follows one which stopped holding a full spool counted
// from zero and took another bound's worth.
func TestChannelSpoolBoundCountsWhatAReplicaBeforeLeft(t *testing.T) {
	spool := t.TempDir()
	bind := pluginsandbox.ChannelBinding{Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0", Agent: "open", SpoolMaxMB: 1}
	first := newFakeSessions()
	first.hold = make(chan struct{}) // never released: the stop cuts m1's turn
	ts := channelServerHook(t, first, "http://127.0.0.1:1/", func(c *pluginsandbox.Config) { c.ChannelSpoolDir = spool })
	web := bindChannels(t, ts, bind)["web"]
	for i := 1; i <= 5; i++ {
		if a := postAnswer(t, web.Listen, bigMessage(fmt.Sprintf("m%d", i))); a.code != http.StatusAccepted {
			t.Fatalf("m%d under the bound: %d %q", i, a.code, a.body)
		}
	}
	testwait.Recv(t, first.prompts) // m1's turn runs, holding the rest
	if err := ts.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := keptFiles(t, spool); n != 5 {
		t.Fatalf("%d messages kept after the stop, want 5", n)
	}

	next := newFakeSessions()
	hold := make(chan struct{}) // the adopted messages stay on disk meanwhile
	next.hold = hold
	ts2 := channelServerHook(t, next, "http://127.0.0.1:1/", func(c *pluginsandbox.Config) { c.ChannelSpoolDir = spool })
	web = bindChannels(t, ts2, bind)["web"]
	wantRefusedForTheBound(t, web.Listen, "m6")
	if n := keptFiles(t, spool); n != 5 {
		t.Fatalf("%d messages kept, want the 5 of the replica before", n)
	}
	close(hold)
	seen := map[string]bool{}
	for range 5 {
		seen[testwait.Recv(t, next.prompts).prompt[:2]] = true
	}
	if len(seen) != 5 {
		t.Fatalf("delivered %v, want m1..m5", seen)
	}
	drainedTakesAgain(t, web.Listen, spool, "m7")
}
