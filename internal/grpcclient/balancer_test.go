package grpcclient

import (
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/balancer"
)

// nopPicker is a child's picker that picks nothing, to time the parent.
type nopPicker struct{}

func (nopPicker) Pick(balancer.PickInfo) (balancer.PickResult, error) {
	return balancer.PickResult{}, nil
}

// BenchmarkPick is what a pick costs the per-method picker against one
// turn over every call (round_robin's): a lock and a map lookup more,
// on calls that cost tens of microseconds over a socket. (A sync.Map
// read without the lock cost as much, load 29: 421-639 ns against
// 493-729, with a looser bound.)
func BenchmarkPick(b *testing.B) {
	pickers := []balancer.Picker{nopPicker{}, nopPicker{}}
	infos := []balancer.PickInfo{{FullMethodName: "/clawmesh.plugin.v1.PluginService/ListTools"}, {FullMethodName: "/clawmesh.plugin.v1.PluginService/ExecuteTool"}}
	b.Run("OneTurn", func(b *testing.B) {
		var next atomic.Uint32
		i := 0
		for b.Loop() {
			n := next.Add(1)
			_, _ = pickers[n%uint32(len(pickers))].Pick(infos[i&1])
			i++
		}
	})
	b.Run("PerMethod", func(b *testing.B) {
		reach := newReachability(RestartGrace, func() {})
		defer reach.close()
		p := &methodPicker{pickers: pickers, reach: reach, turns: map[string]*atomic.Uint32{}}
		i := 0
		for b.Loop() {
			_, _ = p.Pick(infos[i&1])
			i++
		}
	})
}
