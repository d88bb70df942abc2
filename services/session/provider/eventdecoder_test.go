package provider

import (
	"encoding/json"
	"reflect"
	"testing"
)

// eventSamples are events' data as a stream may bring them: OpenAI's
// shapes, white space around them, and what json.Unmarshal refuses
// (more after the value, a value cut short, the wrong types, none).
var eventSamples = []string{
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1741570283,"model":"m","choices":[{"index":0,"delta":{"content":" hi"},"logprobs":null,"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"reasoning_content":"r","reasoning":"s"}},{"index":1,"delta":{"content":"c\u00e9\n"}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"echo","arguments":"{\"x\":"}}]}}]}`,
	`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	`{"choices":[]}`,
	`{"choices":null,"error":{"message":"bad key"}}`,
	`{"error":null}`,
	"  \t{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n ",
	`{"CHOICES":[{"Delta":{"Content":"case"}}]}`,
	`{"choices":[{"delta":{"content":"a"}}],"choices":[{"delta":{"content":"b"}}]}`,
	`{"choices":[{"delta":{"content":"x"}}]} {"choices":[]}`,
	`{"choices":[{"delta":{"content":"x"}}]}}`,
	`{"choices":[{"delta":{"content":"x"}}]}]`,
	`{"choices":[{"delta":{"content":"x"}}]} x`,
	`{"choices":[{"delta":{"content":"x"}}`,
	`{"choices":3}`,
	`{"choices":[{"delta":{"content":5}},{"delta":{"content":"after"}}]}`,
	`{"choices":[{"finish_reason":7,"delta":{"content":"y"}}]}`,
	`[]`,
	`null`,
	`12`,
	`"text"`,
	``,
	`   `,
	`}`,
	`{"a":"\ud800"}`,
	`{"choices":[{"delta":{"content":"\u0000\"\\"}}]}`,
}

// decodeLikeUnmarshal checks that decoding seq's events one after
// another with one eventDecoder and one reused oaChunk gives each the
// chunk and the error json.Unmarshal gives it into a new oaChunk.
func decodeLikeUnmarshal(t *testing.T, seq ...string) {
	t.Helper()
	var d eventDecoder
	var c oaChunk
	for i, e := range seq {
		err := d.decode([]byte(e), &c)
		var want oaChunk
		wantErr := json.Unmarshal([]byte(e), &want)
		if errText(err) != errText(wantErr) {
			t.Fatalf("event %d of %q: error %v, Unmarshal's %v", i, seq, err, wantErr)
		}
		got := c
		if len(got.Choices) == 0 {
			got.Choices = nil // a reused array's empty slice is no choice, as nil is
		}
		if len(want.Choices) == 0 {
			want.Choices = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("event %d of %q: decoded %+v, Unmarshal's %+v", i, seq, got, want)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The stream's decoder gives every event what json.Unmarshal gives it,
// alone and after any other (its Decoder carries state from one event
// to the next, and is made anew after one it refuses).
func TestEventDecoderIsUnmarshal(t *testing.T) {
	for _, a := range eventSamples {
		decodeLikeUnmarshal(t, a)
		for _, b := range eventSamples {
			decodeLikeUnmarshal(t, a, b, a)
		}
	}
}

func FuzzEventDecoder(f *testing.F) {
	for i, a := range eventSamples {
		f.Add(a, eventSamples[(i+1)%len(eventSamples)])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		decodeLikeUnmarshal(t, a, b, a, b)
	})
}
