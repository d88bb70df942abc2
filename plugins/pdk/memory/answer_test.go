package memory

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

func TestRecallAnswerKeepsToItsBudget(t *testing.T) {
	mib := strings.Repeat("m", 1<<20)
	var entries []abi.MemoryEntry
	for _, k := range []string{"newest", "older", "oldest"} {
		entries = append(entries, abi.MemoryEntry{Key: k, Content: mib})
	}
	for _, c := range []struct {
		name string
		in   []abi.MemoryEntry
		keys string
	}{
		{"none", nil, ""},
		{"what fits, best first", entries, "newest"},
		{"small ones", []abi.MemoryEntry{{Key: "a", Content: "x"}, {Key: "b", Content: "y"}}, "a,b"},
		// The first is kept whatever its size: 1 MiB of "\x01" is 6 MiB
		// of JSON.
		{"the first alone", []abi.MemoryEntry{{Key: "c", Content: strings.Repeat("\x01", 1<<20)}, {Key: "b", Content: "y"}}, "c"},
	} {
		b, err := recallAnswer(c.in)
		if err != nil {
			t.Fatal(err)
		}
		var env struct{ Ok []abi.MemoryEntry }
		if err := json.Unmarshal(b, &env); err != nil || env.Ok == nil {
			t.Fatalf("%s: %v %.80s", c.name, err, b)
		}
		var keys []string
		for _, e := range env.Ok {
			keys = append(keys, e.Key)
		}
		if got := strings.Join(keys, ","); got != c.keys {
			t.Errorf("%s: kept %q, want %q", c.name, got, c.keys)
		}
		if len(c.in) > 1 && len(env.Ok) > 1 && len(b) > abi.RecallAnswerBytes {
			t.Errorf("%s: %d bytes", c.name, len(b))
		}
	}
}

func TestDecodeEntry(t *testing.T) {
	in := abi.MemoryEntry{Key: "k\"ey", Content: "a <b> & \u00e9\u65e5 \x01\n\\ \u2028 end", Category: "c", SessionID: "s", Timestamp: 1764900000000}
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeEntry(raw)
	if err != nil || got != in {
		t.Fatalf("decode %s: %+v %v", raw, got, err)
	}
	if got, err := decodeEntry([]byte(`{"key":"k","content":"c","category":null,"extra":[1]}`)); err != nil || got != (abi.MemoryEntry{Key: "k", Content: "c"}) {
		t.Fatalf("null and unknown fields: %+v %v", got, err)
	}
	for _, bad := range []string{``, `[]`, `{"key":1}`, `{"key":"k","timestamp":"x"}`, `{"key":"k"`} {
		if _, err := decodeEntry([]byte(bad)); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}

// appendEntry decodes, by encoding/json, to what encoding/json's own
// encoding of the entry decodes to, whatever the strings hold: escapes,
// HTML's characters, JavaScript's line separators, text that is not
// ASCII, bytes that are not UTF-8 (each U+FFFD), and the fields
// encoding/json omits.
func FuzzAppendEntry(f *testing.F) {
	for _, s := range []string{
		"", "plain", "k\"ey", "a <b> & c", "\x00\x01\x1f\x7f", "\n\r\t\\\b\f", "\u00e9\u65e5\U0001F600",
		"\u2028\u2029", "\xff", "a\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\"\\\"",
	} {
		f.Add(s, s+"!", int64(0), 0.0, false)
		f.Add("key", s, int64(1764900000000), 0.25, true)
	}
	f.Fuzz(func(t *testing.T, key, content string, ts int64, score float64, scored bool) {
		e := abi.MemoryEntry{Key: key, Content: content, Category: content, SessionID: key, Timestamp: ts}
		if scored {
			e.Score = &score
		}
		want, werr := json.Marshal(e)
		got, gerr := appendEntry(nil, e)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("errors: encoding/json %v, appendEntry %v", werr, gerr)
		}
		if werr != nil {
			return
		}
		var w, g abi.MemoryEntry
		if err := json.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%q: %v", got, err)
		}
		if g.Key != w.Key || g.Content != w.Content || g.Category != w.Category || g.SessionID != w.SessionID ||
			g.Timestamp != w.Timestamp || (g.Score == nil) != (w.Score == nil) || g.Score != nil && *g.Score != *w.Score {
			t.Fatalf("%q decodes to %+v, encoding/json's %q to %+v", got, g, want, w)
		}
		if !json.Valid(got) {
			t.Fatalf("%q is not JSON", got)
		}
		// The host reads the answer the short way, to the same entry.
		answer, err := recallAnswer([]abi.MemoryEntry{e})
		if err != nil {
			t.Fatal(err)
		}
		read, ok := abi.DecodeRecallAnswer(answer)
		if !ok || len(read) != 1 || read[0].Key != g.Key || read[0].Content != g.Content || read[0].Category != g.Category ||
			read[0].SessionID != g.SessionID || read[0].Timestamp != g.Timestamp || (read[0].Score == nil) != (g.Score == nil) ||
			g.Score != nil && *read[0].Score != *g.Score {
			t.Fatalf("%q read by the host as %+v (%v), encoding/json %+v", answer, read, ok, g)
		}
	})
}
