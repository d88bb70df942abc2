//go:build internal_testing

package e2e_test

import (
	"net"
	"os"

	"github.com/nats-io/nats.go"
)

// forwardInlineEnv, in a test binary built with -tags internal_testing,
// has the bare path's forwarder write each message to its client on
// nats.go's reader goroutine, through the message filter nats.go keeps for
// its own tests (AddMsgFilter, called before the subscription's delivery;
// returning nil drops the message there), instead of on the
// subscription's goroutine. It measures what the hand-off from the reader
// to a goroutine a subscription costs the second leg. nats.go offers no
// such delivery outside that tag, so this is a measuring tool only: a
// client that reads slowly would hold up every subscription behind it.
const forwardInlineEnv = "CLAWMESH_BENCH_FORWARD_INLINE"

func init() {
	if os.Getenv(forwardInlineEnv) == "" {
		return
	}
	forwardInline = func(nc *nats.Conn, subject string, c net.Conn) func() {
		buf := make([]byte, 0, 512) // only the reader goroutine writes
		nc.AddMsgFilter(subject, func(m *nats.Msg) *nats.Msg {
			buf = append(append(buf[:0], m.Data...), '\n')
			_, _ = c.Write(buf) // a client gone is seen by forward
			return nil
		})
		return func() { nc.RemoveMsgFilter(subject) }
	}
}
