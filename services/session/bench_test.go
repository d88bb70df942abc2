package session

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configclient"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// benchPace is the interval between two chunks of one session, about a
// fast model's token rate; sessions are paced so the figures are latency,
// not the depth of a queue.
const benchPace = time.Millisecond

var benchEpoch = time.Now()

func sinceEpoch() int64 { return int64(time.Since(benchEpoch)) }

// pacedProvider streams as many chunks as its prompt says, one per
// benchPace, each carrying the time it was produced.
type pacedProvider struct{}

func (pacedProvider) Step(ctx context.Context, req ProviderRequest, emit func(Chunk)) (StepResult, error) {
	n, _ := strconv.Atoi(req.Messages[len(req.Messages)-1].Content)
	tick := time.NewTicker(benchPace)
	defer tick.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-ctx.Done():
			return StepResult{}, ctx.Err()
		case <-tick.C:
		}
		emit(Chunk{Text: strconv.FormatInt(sinceEpoch(), 10)})
	}
	return StepResult{}, nil
}

// latencies collects receive-minus-produce times.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(sent int64) {
	d := time.Duration(sinceEpoch() - sent)
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

func (l *latencies) report(b *testing.B) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.d)
	pct := func(p float64) float64 {
		if len(l.d) == 0 {
			return 0
		}
		return float64(l.d[int(p*float64(len(l.d)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

func split(total, parts int) []int {
	out := make([]int, parts)
	for i := range out {
		out[i] = total / parts
		if i < total%parts {
			out[i]++
		}
	}
	return out
}

// followChunks records the latency of every streamed chunk published on
// any session's update subject, decoded as the durable bridge decodes
// them.
func followChunks(nc *nats.Conn, lat *latencies) (*nats.Subscription, error) {
	return bus.SubscribeAllSessionUpdates(nc, func(u bus.Update) {
		if u.Type != busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK {
			return
		}
		var p struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(u.JSON, &p) == nil {
			if sent, err := strconv.ParseInt(p.Text, 10, 64); err == nil {
				lat.add(sent)
			}
		}
	}, func(error) {})
}

// BenchmarkChunkToNATS measures a provider chunk's trip to a NATS
// subscriber (the gateway's seat): the session service's publish path
// (params JSON, Update protobuf, seq under the session's lock, publish)
// and NATS, with 1, 10 and 100 sessions streaming at once. The baseline
// in the same run publishes an Update of the same size directly from the
// same number of goroutines at the same pace, on the same subjects, and
// decodes it the same way.
func BenchmarkChunkToNATS(b *testing.B) {
	h := newHarness(b, func(c *Config) {
		c.Providers = map[string]ProviderFactory{"paced": func(AgentConfig) (Provider, error) { return pacedProvider{}, nil }}
	})
	h.agents.Set(AgentConfig{Agent: configclient.Agent{Alias: "paced", Provider: "paced"}})

	for _, n := range []int{1, 10, 100} {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = h.newSession(alice, "paced")
		}
		b.Run(fmt.Sprintf("session/sessions=%d", n), func(b *testing.B) {
			lat := &latencies{}
			sub, err := followChunks(h.listen, lat)
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
			_ = sub.SetPendingLimits(-1, -1)
			_ = h.listen.Flush()
			b.ResetTimer()
			var wg sync.WaitGroup
			for i, count := range split(b.N, n) {
				wg.Go(func() {
					if count == 0 {
						return
					}
					if _, err := h.srv.Prompt(context.Background(), &sessionv1.PromptRequest{Principal: alice, SessionId: ids[i], Prompt: strconv.Itoa(count)}); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			eventually(b, func() error {
				if got := lat.count(); got < b.N {
					return fmt.Errorf("%d of %d chunks received", got, b.N)
				}
				return nil
			})
			b.StopTimer()
			lat.report(b)
		})

		b.Run(fmt.Sprintf("bare-nats/publishers=%d", n), func(b *testing.B) {
			lat := &latencies{}
			sub, err := followChunks(h.listen, lat)
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Unsubscribe()
			_ = sub.SetPendingLimits(-1, -1)
			_ = h.listen.Flush()
			b.ResetTimer()
			var wg sync.WaitGroup
			for i, count := range split(b.N, n) {
				subject := h.subject(ids[i])
				wg.Go(func() {
					tick := time.NewTicker(benchPace)
					defer tick.Stop()
					for k := 0; k < count; k++ {
						<-tick.C
						body := fmt.Sprintf(`{"session_id":%q,"sessionId":%q,"type":"agent_message_chunk","turn_id":"turn_000000000000000000000000","text":%q}`,
							ids[i], ids[i], strconv.FormatInt(sinceEpoch(), 10))
						data, _ := proto.Marshal(&busv1.SessionUpdate{SessionId: ids[i], Type: busv1.UpdateType_UPDATE_TYPE_AGENT_MESSAGE_CHUNK, Seq: int64(k + 1), Json: body})
						if err := h.nc.Publish(subject, data); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			eventually(b, func() error {
				if got := lat.count(); got < b.N {
					return fmt.Errorf("%d of %d messages received", got, b.N)
				}
				return nil
			})
			b.StopTimer()
			lat.report(b)
		})
	}
}

// BenchmarkStoreFile stores a new 10 MB file a call, an upload's commit as
// the session service sees it: hashed, written, synced, renamed, indexed.
// The files are kept, as an upload's are, so that each write takes page
// cache pages anew; they go with the test's folder at its end. The user's
// quota is past what a run stores (its charge is measured, not its
// refusal).
func BenchmarkStoreFile(b *testing.B) {
	h, _ := quotaHarness(b, 1<<50, 1<<30)
	id := h.newSession(alice, "default")
	data := patterned(10<<20, 0)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := range b.N {
		binary.LittleEndian.PutUint64(data, uint64(i)) // new bytes, a new file
		f, err := h.storeFile(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "bench.bin", Data: data})
		if err != nil || f.GetDeduplicated() {
			b.Fatalf("store: %v %v", f, err)
		}
	}
}
