package pluginsandbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/internal/testenv"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// bigRecallKV is kv whose recall answers one entry whose content is
// bigPeriod repeated bigRepeats times: 15 MiB, each line's newline
// escaped, so that the answer is just under the host's 16 MiB result.
const bigRecallKV = `//go:build wasip1

package main

import (
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

type big struct{ kv }

var content string

func (big) Recall(string, int) ([]memory.Entry, error) {
	if content == "" {
		content = strings.Repeat("0123456789abcd\n", 1<<20-16)
	}
	return []memory.Entry{{Key: "big", Content: content, Category: "notes"}}, nil
}

func init() { memory.Register(big{}) } // after main.go's init
`

// newBigRecallServer serves bigRecallKV with fuel for writing its answer.
func newBigRecallServer(tb testing.TB) *testServer {
	tb.Helper()
	dir := tb.TempDir()
	if err := guestbuild.Install(dir, "kv"); err != nil {
		tb.Fatal(err)
	}
	replaceKV(tb, dir, "testhooks.go", bigRecallKV)
	lim := wasmhost.DefaultLimits()
	lim.CallFuel = 1 << 40
	// The benchmark's recalls take turns in the plugin's one instance,
	// each waiting within its own deadline.
	lim.CallTimeoutMS = 10 * 60 * 1000
	return newTestServerLimits(tb, dir, lim)
}

func recallBig(ctx context.Context, ts *testServer) (*pluginv1.MemoryRecallResponse, error) {
	return ts.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Query: "x", Limit: 10, AnswerLimit: keptBytes})
}

// A memory plugin's recall answer of 16 MiB, for a caller shown 1 MiB of
// it (answer_limit), was held whole by the sandbox before the answer was
// built and cut: copied out of the guest's memory (16 MiB), then decoded
// into entries (15 MiB of content). The entries' strings are now kept
// only as far as the answer shows while the answer is read from the
// guest's memory, and the rest measured, so the recall allocates about
// what is shown.
func TestRecallAnswerCutAsItIsRead(t *testing.T) {
	ts := newBigRecallServer(t)
	ctx := context.Background()
	var got *pluginv1.MemoryRecallResponse
	var err error
	perCall := testenv.AllocatedBytes(func() { got, err = recallBig(ctx, ts) })
	if err != nil {
		t.Fatal(err)
	}
	content := strings.Repeat(bigPeriod, bigRepeats)
	want, total, err := recallanswer.Build(ctx, []*pluginv1.MemoryEntry{{Key: "big", Content: content, Category: "notes"}}, keptBytes)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAnswer() != want || got.GetAnswerBytes() != int64(total) || len(got.GetEntries()) != 0 {
		t.Fatalf("an answer of %d bytes, answer_bytes %d, %d entries; want the first %d of %d", len(got.GetAnswer()), got.GetAnswerBytes(), len(got.GetEntries()), len(want), total)
	}
	t.Logf("a %d-byte answer, %d shown: %d bytes allocated by the recall", total, len(want), perCall)
	if perCall > 4*keptBytes {
		t.Fatalf("a recall showing %d bytes of a %d-byte answer allocated %d bytes", len(want), total, perCall)
	}
}

// BenchmarkConcurrentBigRecalls runs 8 recalls at once, each answered
// 16 MiB of which 1 MiB is shown: B/op is what the 8 allocate,
// peak-RSS-MiB the process's peak resident set over the timed part
// (VmHWM, reset once the server is up), which holds the guest's memory
// too. A memory plugin has one instance, so the 8 take turns in it; what
// the sandbox held of each answer is what overlaps.
func BenchmarkConcurrentBigRecalls(b *testing.B) {
	const calls = 8
	ts := newBigRecallServer(b)
	ctx := context.Background()
	if _, err := recallBig(ctx, ts); err != nil {
		b.Fatal(err)
	}
	benchAtOnce(b, calls, func() error {
		res, err := recallBig(ctx, ts)
		if err == nil && res.GetAnswerBytes() <= keptBytes {
			err = context.Canceled
		}
		return err
	})
}
