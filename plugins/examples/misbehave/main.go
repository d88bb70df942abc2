//go:build wasip1

// Command misbehave is a tool plugin that misbehaves on request, to test the
// host's limits. The "mode" argument selects the misbehaviour:
//
//	loop       spin forever without calling anything (fuel, deadline)
//	spin       run a CPU loop of "n" iterations and return (fuel metering)
//	memhog     allocate "mb" MiB, 1 MiB at a time, touching every page
//	           (memory), then sleep "ms" milliseconds holding it
//	logflood   log "n" records of "size" bytes each (logging queue)
//	panic      panic (trap)
//	sleep      sleep "ms" milliseconds in the host (deadline on a host wait)
//	calls      return how many tool calls this instance has run, this one
//	           included: always 1 when every call gets a fresh instance
//	fail       return the Go error "text" (the err side of the envelope)
//	refuse     return a failed result whose output and error are "text"
//
// The module also exports the channel and memory worlds (worlds.go), so
// one test guest covers every adapter: there a message or entry whose
// content is "panic" panics and "loop" spins forever.
//
// The table grower cannot be written in Go (the Go toolchain never emits
// table.grow); tests build it with wasmbuild.
package main

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/tool"
)

type misbehave struct{}

func (misbehave) Name() string        { return "misbehave" }
func (misbehave) Description() string { return "Misbehaves on request." }
func (misbehave) ParametersSchema() json.RawMessage {
	return json.RawMessage(`{"type":"object","properties":{"mode":{"type":"string"},"n":{"type":"integer"},"mb":{"type":"integer"},"size":{"type":"integer"},"ms":{"type":"integer"},"text":{"type":"string"}},"required":["mode"]}`)
}

var sink []([]byte)

// calls counts tool_execute calls in this instance (mode "calls").
var calls int

//go:noinline
func spin(n int) uint64 {
	var x uint64 = 1
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

func (misbehave) Execute(args json.RawMessage) (tool.Result, error) {
	var in struct {
		Mode string `json:"mode"`
		N    int    `json:"n"`
		MB   int    `json:"mb"`
		Size int    `json:"size"`
		MS   int    `json:"ms"`
		Text string `json:"text"`
	}
	calls++
	if err := json.Unmarshal(args, &in); err != nil {
		return tool.Failure("bad arguments"), nil
	}
	switch in.Mode {
	case "calls":
		return tool.Result{Success: true, Output: strconv.Itoa(calls)}, nil
	case "loop":
		x := 0
		for {
			x++
			if x == -1 {
				break
			}
		}
		return tool.Result{Success: true, Output: strconv.Itoa(x)}, nil
	case "spin":
		return tool.Result{Success: true, Output: strconv.FormatUint(spin(in.N), 10)}, nil
	case "memhog":
		for i := 0; i < in.MB; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = byte(i)
			}
			sink = append(sink, b)
		}
		// With "ms", the memory is held that long in the host's sleep
		// (instances holding memory together).
		time.Sleep(time.Duration(in.MS) * time.Millisecond)
		return tool.Result{Success: true, Output: strconv.Itoa(len(sink))}, nil
	case "logflood":
		msg := strings.Repeat("x", in.Size)
		for i := 0; i < in.N; i++ {
			pdk.Log(pdk.LevelInfo, pdk.Event{Action: "execute", Outcome: "success", Message: msg})
		}
		return tool.Result{Success: true, Output: strconv.Itoa(in.N)}, nil
	case "panic":
		panic("misbehave: asked to panic")
	case "fail":
		return tool.Result{}, errors.New(in.Text)
	case "refuse":
		r := tool.Failure(in.Text)
		r.Output = in.Text
		return r, nil
	case "repeat":
		// An output far longer than its call: text n times.
		return tool.Result{Success: true, Output: strings.Repeat(in.Text, min(in.N, 1<<20))}, nil
	case "sleep":
		time.Sleep(time.Duration(in.MS) * time.Millisecond)
		return tool.Result{Success: true, Output: "slept"}, nil
	}
	return tool.Failure("unknown mode " + in.Mode), nil
}

func init() { tool.Register(misbehave{}) }

func main() {}
