//go:build wasip1

// Command observer is an example observer plugin: it counts the events the
// host hands it and logs each one (action "receive"), so that its work is
// visible in the host's plugin log.
package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/observer"
)

type tally struct{}

var counts = map[string]int{}

func (tally) Name() string { return "tally" }

func (tally) RecordEvent(e observer.Event) error {
	counts[e.Kind]++
	keys := make([]string, 0, len(e.Fields))
	for k := range e.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+e.Fields[k])
	}
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "receive", Outcome: "success",
		Message: fmt.Sprintf("event %s #%d %s", e.Kind, counts[e.Kind], strings.Join(parts, " "))})
	return nil
}

func (tally) Flush() error {
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "receive", Outcome: "success", Message: fmt.Sprintf("flush %v", counts)})
	return nil
}

func init() { observer.Register(tally{}) }

func main() {}
