package memory

import (
	"encoding/json"
	"fmt"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// recallAnswer encodes memory_recall's {"ok":[entry…]} with the entries,
// best first, that keep it within abi.RecallAnswerBytes; the first is
// always kept. Entries past the budget are not encoded at all: encoding is
// most of what a large recall costs in fuel.
func recallAnswer(entries []abi.MemoryEntry) ([]byte, error) {
	out := append(make([]byte, 0, 512), `{"ok":[`...)
	for i, e := range entries {
		// An entry encodes to at least its strings' bytes: one that cannot
		// fit is not encoded.
		if i > 0 && len(out)+len(e.Key)+len(e.Content)+len(e.Category)+len(e.SessionID) > abi.RecallAnswerBytes {
			break
		}
		b, err := json.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("marshal entry %d: %w", i, err)
		}
		if i > 0 {
			if len(out)+1+len(b)+len("]}") > abi.RecallAnswerBytes {
				break
			}
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	return append(out, "]}"...), nil
}
