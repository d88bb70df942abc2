package bus

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/clawmesh/clawmesh/internal/testenv"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// BenchmarkReceiveSessionUpdate sends a streamed chunk's update through
// a real NATS server to a subscriber, one at a time as a turn's chunks
// come, and measures the whole trip in this process: the publisher, the
// server (in-process, testenv.NATS), nats.go's read and delivery, and
// the receiver's handler. The bare subscriber's handler only signals;
// the decoded one is the gateway's (SubscribeSessionUpdates, whose
// handler the hub's dispatch is, measured on its own by the gateway's
// BenchmarkFanOut). The difference is what this package's receiving
// code adds an update.
func BenchmarkReceiveSessionUpdate(b *testing.B) {
	url := testenv.NATS(b)
	pub, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	const id = "s_0123456789abcdef01234567"
	subject, err := SessionUpdateSubject(id, 1)
	if err != nil {
		b.Fatal(err)
	}
	params := []byte(`{"content":{"text":"1796357943194065258 ","type":"text"},"session_id":"` + id + `","sessionId":"` + id + `","sessionUpdate":"agent_message_chunk","turn_id":"t_0123456789abcdef01234567","type":"agent_message_chunk"}`)
	p, err := NewSessionUpdatePublisher(pub, id, 1)
	if err != nil {
		b.Fatal(err)
	}
	for _, path := range []string{"bare", "decoded"} {
		b.Run("path="+path, func(b *testing.B) {
			nc, err := nats.Connect(url)
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			got := make(chan int64, 1)
			var sub *nats.Subscription
			if path == "bare" {
				sub, err = nc.Subscribe(subject, func(*nats.Msg) { got <- 0 })
			} else {
				sub, err = SubscribeSessionUpdates(nc, subject, func(u Update) { got <- u.Seq },
					func(err error) { b.Error(err) })
			}
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			if err := nc.Flush(); err != nil {
				b.Fatal(err)
			}
			var seq int64
			b.ReportAllocs()
			for b.Loop() {
				seq++
				if err := p.Publish(busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, seq, params); err != nil {
					b.Fatal(err)
				}
				if s := <-got; path == "decoded" && s != seq {
					b.Fatalf("update %d received for %d", s, seq)
				}
			}
		})
	}
}
