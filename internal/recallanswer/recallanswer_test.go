package recallanswer_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// checkCutAsWhole fails when the answer BuildCut writes from what
// abi.DecodeRecallAnswerCut read of b differs from the answer Build writes
// from encoding/json's entries (the first limit of them), for a reader
// shown room bytes; or when DecodeRecallAnswerCut reads b and
// encoding/json does not, or refuses what DecodeRecallAnswer reads.
func checkCutAsWhole(t *testing.T, b []byte, limit, room int) {
	t.Helper()
	ctx := context.Background()
	cut, ok := abi.DecodeRecallAnswerCut(b, limit, room)
	if _, short := abi.DecodeRecallAnswer(b); short && !ok {
		t.Fatalf("%q read by DecodeRecallAnswer, refused cut", b)
	}
	if !ok {
		return
	}
	var env map[string]json.RawMessage
	var whole []abi.MemoryEntry
	if err := json.Unmarshal(b, &env); err != nil || len(env) != 1 || env["ok"] == nil {
		t.Fatalf("%q read cut; encoding/json's envelope %v (%v)", b, env, err)
	}
	if err := json.Unmarshal(env["ok"], &whole); err != nil {
		t.Fatalf("%q read cut; encoding/json refuses it: %v", b, err)
	}
	var entries []*pluginv1.MemoryEntry
	for _, e := range whole[:min(len(whole), max(limit, 0))] {
		entries = append(entries, &pluginv1.MemoryEntry{Key: e.Key, Content: e.Content, Category: e.Category})
	}
	want, wantTotal, err := recallanswer.Build(ctx, entries, room)
	if err != nil {
		t.Fatal(err)
	}
	got, total, err := recallanswer.BuildCut(ctx, cut, room)
	if err != nil || got != want || total != wantTotal {
		t.Fatalf("%q, limit %d, room %d: cut as read %q of %d (%v); whole %q of %d", b, limit, room, got, total, err, want, wantTotal)
	}
}

// Answers the guest library writes, others, and strings with a
// character, an escape, a bad byte or a character JSON writes escaped
// across each cut.
var recallCases = []string{
	`{"ok":[]}`,
	`{"ok":[{"key":"k","content":"c"}]}`,
	`{"ok":[{"key":"k","content":"a\nb\u0001\"\\ é","category":"x","session_id":"s-1","timestamp":-12,"score":0.25}]}`,
	`{"ok":[{"key":"a","content":""},{"key":"b","content":"","score":1e3},{"key":"c","content":"","score":-0}]}`,
	`{"ok":[{"key":"k","content":"c","timestamp":1.5}]}`,
	`{"ok":[{"key":"k","content":"c","timestamp":99999999999999999999}]}`,
	`{"ok":[{"key":"k","content":"c","score":1e999}]}`,
	`{"ok":[{"key":"k","content":"c"},]}`,
	`{"ok":[{"key":"k","content":"c"}]} `,
	`{"ok":[{"content":"c","key":"k"}]}`,
	`{"ok":[{"key":"k","content":"c","category":""}]}`,
	`{"ok":null}`,
	`{"err":"no"}`,
	"{\"ok\":[{\"key\":\"k\",\"content\":\"\xff\xc3\"}]}",
	`{"ok":[{"key":"k","content":"\ud800\ud83d\ude00"}]}`,
	`{"ok":[{"key":"aé日🙂","content":"<a&b>\u2028x","category":"\u0000\u001f"},{"key":"k2","content":"a\u00e9\u65e5\ud83d\ude00b","category":"c"}]}`,
	"{\"ok\":[{\"key\":\"k\",\"content\":\"\u2029\u2028é\"},{\"key\":\"\",\"content\":\"\",\"category\":\"<\"},{\"key\":\"x\",\"content\":\"y\"}]}",
	`{"ok":[{"key":"k","content":"abcdefghijklmnop\u00"}]}`,
	`{"ok":[{"key":"k","content":"abcdefghijklmnop","session_id":"\x"}]}`,
	`{"ok":[{"key":"k","content":"c"},{"key":"k","content":"abcdefgh` + "\x01" + `"}]}`,
	``,
}

func TestBuildCutAsWhole(t *testing.T) {
	for _, c := range recallCases {
		for room := 0; room <= len(c)+8; room++ {
			for _, limit := range []int{0, 1, 2, 100} {
				checkCutAsWhole(t, []byte(c), limit, room)
			}
		}
	}
}

func FuzzBuildCut(f *testing.F) {
	for _, c := range recallCases {
		f.Add([]byte(c), uint8(2), uint16(12))
	}
	f.Fuzz(func(t *testing.T, b []byte, limit uint8, room uint16) {
		checkCutAsWhole(t, b, int(limit), int(room))
	})
}

// answerOf16MiB is a recall's answer of one entry whose content is period
// repeated to just under the 16 MiB a guest's result may be, and of a
// second entry the reader is not shown.
func answerOf16MiB(period string) []byte {
	content := strings.Repeat(period, (16<<20-1024)/(len(mustJSON(period))-2))
	b := []byte(`{"ok":[{"key":"big","content":`)
	b = append(b, mustJSON(content)...)
	b = append(b, `,"category":"notes"},{"key":"small","content":`...)
	b = append(b, mustJSON(content[:len(period)*10])...)
	return append(b, `}]}`...)
}

func mustJSON(s string) []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return b
}

// A 16 MiB answer read for a reader shown 1 MiB allocates about that MiB
// twice (the strings' start kept, then the answer written from them):
// decoded whole, it was a copy of 16 MiB and the entries' strings.
func TestBuildCutAllocatesWhatIsShown(t *testing.T) {
	const room = 1 << 20
	ctx := context.Background()
	for _, period := range []string{"plain text ", "a \"quoted\" line\n", "é日🙂<&>"} {
		answer := answerOf16MiB(period)
		var (
			text  string
			total int
			err   error
		)
		perCall := testenv.AllocatedBytes(func() {
			cut, ok := abi.DecodeRecallAnswerCut(answer, 100, room)
			if !ok {
				t.Fatalf("%q: not read", period)
			}
			text, total, err = recallanswer.BuildCut(ctx, cut, room)
		})
		if err != nil || len(text) > room || len(text) < room-6 || total <= room {
			t.Fatalf("%q: an answer of %d bytes of %d, %v", period, len(text), total, err)
		}
		t.Logf("%q: a %d-byte answer, %d bytes shown of %d: %d bytes allocated", period, len(answer), len(text), total, perCall)
		if perCall > 3*room {
			t.Errorf("%q: reading a %d-byte answer to show %d bytes allocated %d bytes", period, len(answer), room, perCall)
		}
	}
}
