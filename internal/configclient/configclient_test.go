package configclient_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// liveStub answers Live with a settable revision; the config service's
// own tests run the client against the real service.
type liveStub struct {
	configv1.ConfigServiceClient
	mu    sync.Mutex
	rev   int64
	calls int
}

func (l *liveStub) set(rev int64) { l.mu.Lock(); l.rev = rev; l.mu.Unlock() }

func (l *liveStub) Live(context.Context, *configv1.LiveRequest, ...grpc.CallOption) (*configv1.LiveResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	doc, _ := structpb.NewStruct(map[string]any{"rev": fmt.Sprint(l.rev)})
	return &configv1.LiveResponse{Revision: l.rev, Document: doc}, nil
}

// Announcements are hints: each revision is read from the config service,
// in order, and an announcement of a revision the service does not have
// (forged, or from a stale process) installs nothing and pins nothing.
func TestRevisionsReadFromTheService(t *testing.T) {
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stub := &liveStub{rev: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := configclient.New(ctx, stub, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Current().Revision != 3 || c.Current().String("rev") != "3" {
		t.Fatalf("start: %+v", c.Current())
	}
	var mu sync.Mutex
	var seen []string
	c.OnChange(func(s configclient.Snapshot, props []string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%d%v", s.Revision, props))
	})
	announce := func(rev int64) {
		if err := bus.PublishConfigChanged(nc, rev, []string{"rev"}); err != nil {
			t.Fatal(err)
		}
	}
	at := func(rev int64) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
			if got := c.Current().Revision; got != rev {
				return fmt.Errorf("at revision %d, want %d", got, rev)
			}
			return nil
		})
	}
	announce(2) // older than what was read: not even read
	stub.set(4)
	announce(4)
	at(4)
	stub.set(7)
	announce(6) // 5 and 6 were committed, 7 meanwhile: read as one gap
	at(7)

	// A forged announcement of revision 100: the service is at 8, so 8 is
	// installed and 100 is not pinned: 9 still arrives.
	stub.set(8)
	announce(100)
	at(8)
	stub.set(9)
	announce(9)
	at(9)
	if c.Current().String("rev") != "9" {
		t.Fatalf("document %v", c.Current().Document)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[4[rev] 7[] 8[] 9[rev]]" {
		t.Fatalf("watchers saw %v", seen)
	}
}

// A revision committed while the bus was away from this process was
// announced to no one here: it is read as soon as the connection is
// back, not at the next Resync (30 s on).
func TestRevisionCommittedWhileTheBusWasAwayIsReadOnReconnect(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := natsutil.Connect(natsutil.Options{URL: srv.URL(), Name: "session", Log: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stub := &liveStub{rev: 3}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := configclient.New(ctx, stub, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	srv.Shutdown()
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if nc.IsConnected() {
			return fmt.Errorf("the bus connection was not seen dropped")
		}
		return nil
	})
	stub.set(4) // committed now: its announcement reaches no one
	srv.Start()
	back := time.Now()
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if got := c.Current().Revision; got != 4 {
			return fmt.Errorf("at revision %d, want 4", got)
		}
		return nil
	})
	t.Logf("revision 4 read %v after the bus came back", time.Since(back).Round(time.Millisecond))
}

// The typed views take absent properties from the schema's defaults.
func TestSettingsDefaults(t *testing.T) {
	s := configclient.Snapshot{Document: map[string]any{
		"rpc":    map[string]any{"max_local_connections": float64(7)},
		"agents": map[string]any{"gpt": map[string]any{"provider": "openai", "tools": []any{"echo"}}},
	}}
	l := s.RPCLimits()
	if l.MaxConnections != 7 || l.MaxFrameBytes != 8<<20 || l.FrameTimeout != 30*time.Second || l.MaxInflightRequests != 64 {
		t.Fatalf("rpc limits %+v", l)
	}
	p := s.PluginSettings()
	if p.CallFuel != 1_000_000_000 || p.MaxInstances != 64 || p.SignatureMode != "permissive" {
		t.Fatalf("plugin settings %+v", p)
	}
	a, ok := s.Agent("gpt")
	if !ok || a.Provider != "openai" || a.Timeout != 60*time.Second || len(a.Tools) != 1 || a.ApprovalTimeout != 120*time.Second {
		t.Fatalf("agent %+v %v", a, ok)
	}
	if _, ok := s.Agent("nobody"); ok {
		t.Fatal("an unknown agent was found")
	}
	if u := s.Uploads(); u.MaxStagedBytes != 256<<20 || u.MaxPerConnection != 4 || u.IdleTimeout != 5*time.Minute {
		t.Fatalf("uploads %+v", u)
	}
}
