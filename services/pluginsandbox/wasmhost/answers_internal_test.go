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
}

// decodePoll gives what decodeResult gives for a message within its
// bounds, and refuses one past them, whatever the shape.
func TestDecodePollAsTheGeneralPath(t *testing.T) {
	for _, c := range pollCases {
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
	got, gotErr := decodePoll(out)
	var want *ChannelMessage
	wantErr := decodeEnvelope("channel_poll_message", out, &want)
	if wantErr == nil && want != nil {
		for i, s := range []string{want.ID, want.Sender, want.ReplyTarget, want.Content, want.ThreadID} {
			if f := pollFields[i]; len(s) > f.bound {
				wantErr = pollFieldTooBig(f.name, len(s), f.bound)
				break
			}
		}
	}
	if gotErr != nil && wantErr != nil && errors.Is(gotErr, ErrABI) && strings.Contains(gotErr.Error(), "whose") {
		// Refused at the first field past its bound, before the
		// rest was checked.
		return
	}
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || gotErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q polled as %+v (%v), the general path %+v (%v)", out, got, gotErr, want, wantErr)
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
