package wasmhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/plugins/abi"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// BenchmarkDecodeRecallAnswer is the host's share of a 1 MiB recall
// answer: decodeRecall over the JSON the guest wrote, for texts whose
// escapes make the JSON one to six times the text.
func BenchmarkDecodeRecallAnswer(b *testing.B) {
	for _, c := range []struct{ name, period string }{
		{"plain", "the quick brown fox jumps over the lazy dog "},
		{"lines", "a line of a log\n"},
		{"quotes", `"\`},
		{"control", "\x01"},
	} {
		text := strings.Repeat(c.period, (1<<20)/len(c.period))
		out, err := json.Marshal(map[string][]abi.MemoryEntry{"ok": {{Key: "k", Content: text, Timestamp: 1}}})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(out)))
			for b.Loop() {
				got, err := decodeRecall(out)
				if err != nil || len(got) != 1 || got[0].Content != text {
					b.Fatalf("decoded %d entries: %v", len(got), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/answer")
		})
	}
}

// decodeResultCases are envelopes a guest may write: the library's own
// shape, and ones only the general path reads or refuses.
var decodeResultCases = []string{
	`{"ok":[{"key":"k","content":"a\u0001\"b","timestamp":3,"score":0.5}]}`,
	`{"ok":[]}`, `{"ok":null}`, `{"ok":true}`, `{"ok":7}`, `{"err":"no"}`,
	`{"ok":1,"ok":2}`, `{"ok":1,"err":"x"}`, `{"ok":1}}`, `{"ok":1} `, ` {"ok":1}`,
	`{"ok": [ ]}`, `{"ok":[1]}`, `{"ok":"x"}`, `{"ok":{"key":"k"}}`, `{"ok":[{"key":5}]}`,
	`{"ok":[{"key":"\ud800"}]}`, "{\"ok\":[{\"key\":\"\xff\"}]}", `{"ok":}`, `{"ok":`, `{"ok":"}`,
	`{"OK":1}`, `{"ok":[{"KEY":"k"}]}`, `{}`, `[]`, ``,
}

// decodeResult and decodeRecall answer every envelope as the general path
// does: the same value into each kind of target, or the same error.
func TestDecodeResultAsTheGeneralPath(t *testing.T) {
	for _, c := range decodeResultCases {
		checkDecodeResult(t, []byte(c))
	}
}

func FuzzDecodeResult(f *testing.F) {
	for _, c := range decodeResultCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkDecodeResult)
}

func checkDecodeResult(t *testing.T, out []byte) {
	got, gotErr := decodeRecall(out)
	var want []abi.MemoryEntry
	wantErr := decodeEnvelope(abi.ExportMemoryRecall, out, &want)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || gotErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q recalled as %+v (%v), the general path %+v (%v)", out, got, gotErr, want, wantErr)
	}
	for _, target := range []func() any{
		func() any { return new([]abi.MemoryEntry) },
		func() any { return new(bool) },
		func() any { return new(int) },
		func() any { return nil },
	} {
		got, want := target(), target()
		gotErr, wantErr := decodeResult("recall", out, got), decodeEnvelope("recall", out, want)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%q into %T: error %v, the general path %v", out, got, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q into %T: %v, the general path %v", out, got, reflect.ValueOf(got).Elem(), reflect.ValueOf(want).Elem())
		}
	}
}

// An answer in a shape other than the guest library's (spaces, fields in
// another order) is read whole and measured: the answer built from it is
// the one built from encoding/json's entries, cut to the limit; an err
// answer is the plugin's failure.
func TestRecallCutWholeAsBuild(t *testing.T) {
	ctx := context.Background()
	out := []byte(`{ "ok" : [ {"content":"c\u003c\n","key":"a"}, {"category":"x","key":"b","content":"é"}, {"key":"c","content":""} ] }`)
	for limit := 0; limit <= 4; limit++ {
		cut, err := recallCutWhole(out, limit)
		if err != nil {
			t.Fatal(err)
		}
		var env struct{ Ok []abi.MemoryEntry }
		if err := json.Unmarshal(out, &env); err != nil {
			t.Fatal(err)
		}
		var entries []*pluginv1.MemoryEntry
		for _, e := range env.Ok[:min(limit, len(env.Ok))] {
			entries = append(entries, &pluginv1.MemoryEntry{Key: e.Key, Content: e.Content, Category: e.Category})
		}
		for room := 0; room < 80; room++ {
			want, wantTotal, _ := recallanswer.Build(ctx, entries, room)
			got, total, _ := recallanswer.BuildCut(ctx, cut, room)
			if got != want || total != wantTotal {
				t.Fatalf("limit %d, room %d: %q of %d; want %q of %d", limit, room, got, total, want, wantTotal)
			}
		}
	}
	if _, err := recallCutWhole([]byte(`{"err":"refused"}`), 10); !errors.Is(err, ErrPluginFailed) {
		t.Fatalf("an err answer: %v", err)
	}
}
