package wasmhost

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// argsOracle is how Execute built a guest's arguments before toolArgs:
// decoded into a map, the caller's "__config" dropped, the config put
// there, encoded with encoding/json. toolArgs must give the same bytes,
// or fail where it fails.
func argsOracle(raw, config json.RawMessage) ([]byte, bool) {
	var args map[string]json.RawMessage
	if len(raw) == 0 {
		args = map[string]json.RawMessage{}
	} else if err := json.Unmarshal(raw, &args); err != nil || args == nil {
		return nil, false
	}
	delete(args, "__config")
	if config != nil {
		args["__config"] = config
	}
	out, err := json.Marshal(args)
	return out, err == nil
}

func buildArgs(raw, config json.RawMessage) ([]byte, error) {
	a, err := readToolArgs(raw)
	if err != nil {
		return nil, err
	}
	return a.with(config)
}

var argsCases = []string{
	``,
	`{}`,
	` { } `,
	`{"text":"hello"}`,
	`{"b":1,"a":2}`,
	"{ \"b\" : [1, {\"x\" : \"y z\"}] ,\n\t\"a\":null }",
	`{"a":1,"a":2}`,
	`{"a":1,"b":true,"a":{"c":[]}}`,
	`{"__config":{"token":"forged"},"q":"x"}`,
	`{"q":"x","__config":1,"__config":2}`,
	`{"\u005f_config":{"token":"forged"}}`,
	`{"__confi\u0067":1,"x":2}`,
	`{"é":1,"e":2}`,
	`{"a\"b":"c"}`,
	`{"<":1}`,
	`{"a":"<script>&"}`,
	"{\"a\":\"\u2028\"}",
	`{"a":"\"}{,:[]\\","b":"\\"}`,
	`{"n":-1.5e+10,"t":true,"f":false,"z":null}`,
	`{"nested":{"__config":"kept: not top level"}}`,
	`{"a":"` + "\xff\xfe" + `"}`,
	"{\"\xff\":1}",
	`[]`,
	`"text"`,
	`null`,
	`1`,
	`{`,
	`{"a":1}{}`,
	`{"a":1,}`,
	`{"a" 1}`,
	` `,
}

func TestToolArgsAsEncodingJSON(t *testing.T) {
	for _, config := range []json.RawMessage{nil, json.RawMessage(`{"region":"eu","n":3}`)} {
		for _, raw := range argsCases {
			want, ok := argsOracle(json.RawMessage(raw), config)
			got, err := buildArgs(json.RawMessage(raw), config)
			switch {
			case !ok && err == nil:
				t.Errorf("%q: %s, want an error", raw, got)
			case !ok && !errors.Is(err, ErrABI):
				t.Errorf("%q: %v, want ErrABI", raw, err)
			case ok && err != nil:
				t.Errorf("%q: %v, want %s", raw, err, want)
			case ok && !bytes.Equal(got, want):
				t.Errorf("%q with config %s:\n got %s\nwant %s", raw, config, got, want)
			}
		}
	}
}

// The short way is the one taken for ordinary arguments, and it never
// lets a caller's "__config" through, however it is written.
func TestToolArgsConfigIsTheHosts(t *testing.T) {
	a, err := readToolArgs(json.RawMessage(`{"text":"hello","n":[1,2]}`))
	if err != nil || a.byMap != nil {
		t.Fatalf("ordinary arguments went by the map (%v)", err)
	}
	for _, raw := range []string{
		`{"__config":{"token":"forged"}}`,
		`{"\u005f\u005fconfig":{"token":"forged"}}`,
		`{"__config":{"token":"forged"},"__config":{"token":"forged"}}`,
	} {
		for _, config := range []json.RawMessage{nil, json.RawMessage(`{"token":"real"}`)} {
			got, err := buildArgs(json.RawMessage(raw), config)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(got, []byte("forged")) {
				t.Errorf("%s with config %s: %s", raw, config, got)
			}
		}
	}
}

func FuzzToolArgs(f *testing.F) {
	for _, raw := range argsCases {
		f.Add([]byte(raw), false)
		f.Add([]byte(raw), true)
	}
	config := json.RawMessage(`{"k":"v"}`)
	f.Fuzz(func(t *testing.T, raw []byte, withConfig bool) {
		var c json.RawMessage
		if withConfig {
			c = config
		}
		want, ok := argsOracle(raw, c)
		got, err := buildArgs(raw, c)
		if ok != (err == nil) || (ok && !bytes.Equal(got, want)) {
			t.Fatalf("%q: got %s (%v), want %s (ok %v)", raw, got, err, want, ok)
		}
	})
}
