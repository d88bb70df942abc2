package wasmhost

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// pollCases are poll answers: the guest library's shape, others
// encoding/json reads, and ones it refuses.
var pollCases = []string{
	`{"ok":null}`, ` { "ok" : null } `, `{"ok":{}}`, `{"ok":{ }}`,
	`{"ok":{"id":"m","sender":"s","reply_target":"r","content":"c\u003c\n","thread_id":"t","timestamp":7}}`,
	`{"ok":{"timestamp":-1,"content":"\ud800x","id":null,"sender":"\u00e9"}}`,
	"{\"ok\":{\"content\":\"\xff\"}}",
	`{"ok":{"id":"a","id":"b"}}`, `{"ok":{"ID":"a"}}`, `{"ok":{"x":1,"id":"a"}}`,
	`{"ok":{"id":"a",}}`, `{"ok":{,"id":"a"}}`, `{"ok":{"id":"a"}`, `{"ok":{"id":"a"}}}`,
	`{"ok":{"timestamp":1.5}}`, `{"ok":{"timestamp":"1"}}`, `{"ok":{"timestamp":1e2}}`,
	`{"ok":{"timestamp":99999999999999999999}}`, `{"ok":{"id":5}}`, `{"ok":{"id":nul}}`,
	`{"ok":[]}`, `{"ok":"x"}`, `{"ok":null,"err":"x"}`, `{"err":"no"}`, ` {"err" : "n\"o" } `,
	`{"err":5}`, `{"err":"a","err":"b"}`, `{"ok":{"id":"a"}} x`, ``, `{`,
	// Past a content bound of 3: refused, holding the sender's fields.
	`{"ok":{"id":"m","sender":"s","content":"long","thread_id":"t","timestamp":2}}`,
	`{"ok":{"content":"long","reply_target":"r","id":"m","sender":"s"}}`,
	`{"ok":{"content":"long","id":"m"`, `{"ok":{"content":"long","id":"m","x":1}}`,
	`{"ok":{"content":"lo\u006eg","sender":"s","content":"x"}}`,
}

// longPollCases are a thread past its 16 KiB, then a content measured
// only: not fuzz seeds, which the fuzzer spends its time minimizing.
var longPollCases = []string{
	`{"ok":{"thread_id":"` + strings.Repeat("t", 16<<10+1) + `","content":"long","sender":"s","id":"m"}}`,
	`{"ok":{"thread_id":"` + strings.Repeat("t", 16<<10+1) + `","content":"ok","sender":"s"}}`,
}

// decodePoll gives what decodeResult gives for a message within its
// bounds, and refuses one past them, whatever the shape.
func TestDecodePollAsTheGeneralPath(t *testing.T) {
	for _, c := range append(pollCases, longPollCases...) {
		checkDecodePoll(t, []byte(c))
	}
}

func FuzzDecodePoll(f *testing.F) {
	for _, c := range pollCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkDecodePoll)
}

func checkDecodePoll(t *testing.T, out []byte) {
	// The default content bound, and a small one that the cases pass.
	for _, content := range []int{DefaultPolledContentBytes, 3} {
		checkDecodePollBound(t, out, content)
	}
}

func checkDecodePollBound(t *testing.T, out []byte, content int) {
	got, gotErr := decodePoll(out, content)
	var want *ChannelMessage
	wantErr := decodeEnvelope("channel_poll_message", out, &want)
	var wantRefused *PollRefusedError
	if wantErr == nil && want != nil {
		kept := *want
		kept.Content = ""
		for i, s := range messageStrings(want) {
			if b := fieldBound(i, content); len(*s) > b {
				if wantRefused == nil {
					wantRefused = &PollRefusedError{Field: pollFields[i].name, Size: len(*s), Bound: b, Msg: &kept}
				}
				*messageStrings(&kept)[i] = ""
			}
		}
		if wantRefused != nil {
			wantErr, want = wantRefused, nil
		}
	}
	var refused *PollRefusedError
	if errors.As(gotErr, &refused) && wantRefused != nil {
		// Refused at the first field past its bound in the answer's
		// order, which may be another than pollFields'; the sender's
		// fields are the ones within their bounds, whatever the order.
		if !errors.Is(gotErr, ErrABI) || !reflect.DeepEqual(refused.Msg, wantRefused.Msg) {
			t.Fatalf("%q polled with content bound %d as %v holding %+v, want %v holding %+v", out, content, gotErr, refused.Msg, wantErr, wantRefused.Msg)
		}
		return
	}
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || gotErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q polled with content bound %d as %+v (%v), the general path %+v (%v)", out, content, got, gotErr, want, wantErr)
	}
}

// An err message past errMessageBytes is cut at a character, with its
// whole size; the general path (an err in another shape) cuts it alike.
func TestPluginErrorCut(t *testing.T) {
	for _, msg := range []string{strings.Repeat("a", errMessageBytes), strings.Repeat("a", errMessageBytes+1), strings.Repeat("a", errMessageBytes-1) + "é"} {
		out := []byte(`{"err":"` + msg + `"}`)
		short, ok := errAnswerCut(out)
		general := decodeEnvelope("x", []byte(`{"err":"`+msg+`","x":1}`), nil)
		want := fmt.Sprintf("%v: %s", ErrPluginFailed, msg)
		if len(msg) > errMessageBytes {
			cut := msg[:errMessageBytes]
			if !strings.HasPrefix(msg, cut) || msg[len(cut)]&0xc0 == 0x80 {
				cut = strings.TrimSuffix(cut, "\xc3")
			}
			want = fmt.Sprintf("%v: %s [plugin error cut: %d of %d bytes shown]", ErrPluginFailed, cut, len(cut), len(msg))
		}
		if !ok || short.Error() != want || general.Error() != want {
			t.Errorf("a %d-byte message: %.80v / %.80v; want %.80s...", len(msg), short, general, want)
		}
	}
}
