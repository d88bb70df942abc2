package durablebridge

import (
	"strings"
	"testing"
)

// A send whose text is blank in the part that is kept (the first 32 KiB)
// is refused as a blank text is: accepted, it reached a busy pane's
// queue, where the session service refused it as no prompt at every
// drain and it stayed at the head, holding back every text behind it.
func TestSendRefusesTextBlankWithinItsLimit(t *testing.T) {
	for _, text := range []string{
		strings.Repeat(" ", maxPhoneText) + "hello",
		strings.Repeat("\n", maxPhoneText-1) + "\u00e9",
		"",
		" \t\n",
	} {
		body := map[string]any{"requestId": "r1", "text": text}
		if cmd, msg := parsePost("send", body, []string{"p1"}); cmd != nil || msg == "" {
			t.Errorf("text of %d bytes, %q...: accepted", len(text), text[:min(len(text), 8)])
		}
	}
	body := map[string]any{"requestId": "r1", "text": "x" + strings.Repeat(" ", maxPhoneText)}
	if cmd, msg := parsePost("send", body, []string{"p1"}); cmd == nil {
		t.Errorf("a text with a character in its first 32 KiB: refused, %s", msg)
	}
}
