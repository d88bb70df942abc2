package jsonstr

import (
	"encoding/json"
	"testing"
)

// NumberEnd reads a whole literal exactly when encoding/json takes it as
// a number; the gateway's frame validator (fuzzed against json.Valid)
// holds it over whole frames.
func TestNumberEnd(t *testing.T) {
	for _, lit := range []string{
		"0", "-0", "7", "-12", "10", "01", "-", "", "1.", ".5", "1.50", "1e", "1e5", "1E+5", "1e-05", "-0.0e0",
		"1ee5", "+1", "0x10", "1.e5", "00", "123456789012345678901234567890", "1 ", "2,",
	} {
		end := NumberEnd([]byte(lit), 0)
		var n json.Number
		whole := json.Unmarshal([]byte(lit), &n) == nil && lit != "" && lit[len(lit)-1] != ' '
		if (end == len(lit)) != whole {
			t.Errorf("%q: NumberEnd %d, encoding/json reads a number: %v", lit, end, whole)
		}
	}
	if end := NumberEnd([]byte(`{"a":-1.5e3}`), 5); end != 11 {
		t.Errorf("a number inside a document ends at %d", end)
	}
}
