package gateway

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/hostclock"
	"github.com/clawmesh/clawmesh/internal/testwait"
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// stampedSession answers Status with the number of its call as the count
// of active sessions; the first call waits for the test to say which
// read_at it answers with.
type stampedSession struct {
	sessionv1.UnimplementedSessionServiceServer
	readAt chan int64
	calls  chan struct{}
	n      atomic.Int64 // calls this round
	total  atomic.Int64
}

func (s *stampedSession) Status(context.Context, *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	n := s.n.Add(1)
	s.total.Add(1)
	at := hostclock.Early()
	if n == 1 {
		s.calls <- struct{}{}
		at = <-s.readAt
	}
	return &sessionv1.StatusResponse{ActiveSessions: n, ReadAt: at}, nil
}

func (*stampedSession) ConnectionClosed(context.Context, *sessionv1.ConnectionClosedRequest) (*sessionv1.ConnectionClosedResponse, error) {
	return &sessionv1.ConnectionClosedResponse{}, nil
}

// A status that arrives while the shared read is in flight is answered by
// that read when the session service read after it arrived (by the
// host's clock), and by a read of its own otherwise; a read_at later than
// the answer's arrival shows the service's clock is not the gateway's,
// and from then on none is trusted.
func TestSharedReadAnswersWhoCameBeforeTheServiceRead(t *testing.T) {
	cases := []struct {
		name string
		// readAt is the first read's read_at, given the second status's
		// arrival bracketed by sent and seen (its health's answer).
		readAt    func(sent, seen int64) int64
		second    int64 // the read that answers the second status
		apart     bool
		afterward int64 // then, with a truthful read_at after the arrival
	}{
		{"read after the arrival", func(_, seen int64) int64 { return seen }, 1, false, 1},
		{"read before the arrival", func(sent, _ int64) int64 { return sent - 1 }, 2, false, 1},
		{"no read_at", func(int64, int64) int64 { return 0 }, 2, false, 1},
		{"a clock ahead of the gateway's", func(int64, int64) int64 { return hostclock.Late() + int64(time.Hour) }, 2, true, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sess := &stampedSession{readAt: make(chan int64), calls: make(chan struct{}, 1)}
			g, socket := runGateway(t, sess, 10*time.Second)
			c := dialInitialized(t, socket)
			defer c.Close()
			round := func(readAt func(sent, seen int64) int64) (first, second int64) {
				t.Helper()
				sess.n.Store(0)
				if err := c.Send(`{"jsonrpc":"2.0","id":1,"method":"status","params":{}}`); err != nil {
					t.Fatal(err)
				}
				testwait.Recv(t, sess.calls) // the first read is in flight
				sent := hostclock.Early()
				// health is answered after the read loop handed the status
				// before it to the shared reads, stamped with its arrival.
				if err := c.Send(`{"jsonrpc":"2.0","id":2,"method":"status","params":{}}` + "\n" +
					`{"jsonrpc":"2.0","id":3,"method":"health","params":{}}`); err != nil {
					t.Fatal(err)
				}
				if f, _, err := c.Read(10 * time.Second); err != nil || string(f.ID) != "3" {
					t.Fatalf("first answer %+v, %v; want health's", f, err)
				}
				sess.readAt <- readAt(sent, hostclock.Late())
				got := map[string]int64{}
				for range 2 {
					f, _, err := c.Read(10 * time.Second)
					if err != nil || f.Error != nil {
						t.Fatalf("status: %+v, %v", f, err)
					}
					var r struct {
						Active int64 `json:"active_sessions"`
					}
					if err := json.Unmarshal(f.Result, &r); err != nil {
						t.Fatal(err)
					}
					got[string(f.ID)] = r.Active
				}
				return got["1"], got["2"]
			}
			first, second := round(tc.readAt)
			if first != 1 || second != tc.second {
				t.Fatalf("statuses answered by reads %d and %d; want 1 and %d", first, second, tc.second)
			}
			if g.clockApart.Load() != tc.apart {
				t.Fatalf("clock apart: %v, want %v", g.clockApart.Load(), tc.apart)
			}
			if _, second = round(func(_, seen int64) int64 { return seen }); second != tc.afterward {
				t.Fatalf("afterwards the second status was answered by read %d; want %d", second, tc.afterward)
			}
			time.Sleep(50 * time.Millisecond) // a read for nobody would come now
			if n, want := sess.total.Load(), tc.second+tc.afterward; n != want {
				t.Fatalf("%d reads, want %d", n, want)
			}
		})
	}
}
