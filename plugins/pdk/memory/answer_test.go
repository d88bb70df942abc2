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
		// The first is kept whatever its size: 1 MiB of "<" is 6 MiB
		// of JSON.
		{"the first alone", []abi.MemoryEntry{{Key: "lt", Content: strings.Repeat("<", 1<<20)}, {Key: "b", Content: "y"}}, "lt"},
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
