package gateway

import (
	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
	"github.com/clawmesh/clawmesh/internal/hostclock"
	"go.uber.org/zap"
)

// sharedRead is one shared read's answer (status's or session/state's),
// encoded once for every caller it answers, with the moment the session
// service read the state, on the host's clock (hostclock; 0 when unknown).
//
// That moment lets the read answer, besides the callers that were
// waiting when it started, those that arrived while it was in flight but
// no later than the service read (coalesce.Group.Fresh): the answer
// reflects every write the service answered before them. Under 64
// clients polling status a caller so waits about one and a half reads
// instead of two, and status serves a tenth more (docs/performance.md,
// eighteenth round).
type sharedRead struct {
	enc    jsonrpc.EncodedJSON
	readAt int64
}

// initSharedReads sets up statusReads and stateReads once the limits are
// known.
func (g *Gateway) initSharedReads() {
	g.largeReads = make(chan struct{}, maxLargeReads)
	// A shared read has the deadline of one quick call from its start.
	g.statusReads.Timeout, g.stateReads.Timeout = g.deadline(kindQuick), g.deadline(kindQuick)
	logPanic := func(v any) { g.log.Error("shared read panicked", zap.Any("panic", v), zap.StackSkip("stack", 2)) }
	g.statusReads.OnPanic, g.stateReads.OnPanic = logPanic, logPanic
	g.statusReads.Fresh, g.stateReads.Fresh = fresh, fresh
	g.statusReads.Clock, g.stateReads.Clock = hostclock.Late, hostclock.Late
}

// fresh is coalesce.Group.Fresh for shared reads.
func fresh(r sharedRead, arrived int64) bool { return r.readAt != 0 && arrived <= r.readAt }

// readAt is the service's read_at when it can be trusted: the service
// and the gateway must read one clock, as every process and container on
// one Linux host does, unless it sits in a time namespace of its own or
// on another host. A read_at later than the answer's arrival proves the
// clocks apart; from then on the gateway makes callers wait for the next
// read, as it does with a service that sends no read_at. A clock behind
// ours only makes fewer callers share a read.
func (g *Gateway) readAt(at int64) int64 {
	if at == 0 || g.clockApart.Load() {
		return 0
	}
	if at > hostclock.Late() {
		if g.clockApart.CompareAndSwap(false, true) {
			g.log.Warn("the session service's clock is not the gateway's: shared reads answer only the callers that came before them",
				zap.Int64("read_at", at))
		}
		return 0
	}
	return at
}
