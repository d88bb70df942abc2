package configclient_test

import (
	"context"
	"errors"
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
	// once, when not zero, is the revision the next Live alone serves
	// (a read from a process that lags).
	once int64
	// hist is the history id served, and written in the document.
	hist string
}

func (l *liveStub) set(rev int64) { l.mu.Lock(); l.rev = rev; l.mu.Unlock() }

func (l *liveStub) Live(context.Context, *configv1.LiveRequest, ...grpc.CallOption) (*configv1.LiveResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	rev := l.rev
	if l.once != 0 {
		rev, l.once = l.once, 0
	}
	doc, _ := structpb.NewStruct(map[string]any{"rev": fmt.Sprint(rev), "hist": l.hist})
	return &configv1.LiveResponse{Revision: rev, Document: doc, History: l.hist}, nil
}

// Announcements are hints: each revision is read from the config service,
// in order, and an announcement of a revision the service does not have
// (forged, or from a stale process) installs nothing and pins nothing.
func TestRevisionsReadFromTheService(t *testing.T) {
	stub := &liveStub{rev: 3}
	c, nc := follow(t, stub)
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
	// Older than what was read: read (a replaced history would be
	// lower), and nothing installed, the service being at 3.
	calls := func() int { stub.mu.Lock(); defer stub.mu.Unlock(); return stub.calls }
	before := calls()
	announce(2)
	testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
		if calls() == before {
			return fmt.Errorf("revision 2's announcement not read yet")
		}
		return nil
	})
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

// A config service whose database was replaced or reset serves a
// history whose revisions are below the one read: every one of them was
// ignored (as older than what was read), so the process kept the old
// document until the new history passed the old revision number. A
// lower revision the service still serves when asked again is now a new
// history, followed from there; one read that lagged is not.
func TestReplacedHistoryIsFollowed(t *testing.T) {
	stub := &liveStub{rev: 9}
	c, nc := follow(t, stub)
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
	calls := func() int { stub.mu.Lock(); defer stub.mu.Unlock(); return stub.calls }
	at := func(rev int64) {
		t.Helper()
		testenv.Eventually(t, 15*time.Second, 5*time.Millisecond, func() error {
			if got := c.Current(); got.Revision != rev || got.String("rev") != fmt.Sprint(rev) {
				return fmt.Errorf("at revision %d (%v), want %d", got.Revision, got.Document, rev)
			}
			return nil
		})
	}

	// One read that lags (revision 8 once), then the service is at 9
	// again: nothing is installed.
	stub.mu.Lock()
	stub.once = 8
	stub.mu.Unlock()
	before := calls()
	announce(8)
	testenv.Eventually(t, 15*time.Second, 5*time.Millisecond, func() error {
		if n := calls() - before; n < 2 {
			return fmt.Errorf("%d reads since the lagging one's announcement, want its second read", n)
		}
		return nil
	})
	if got := c.Current().Revision; got != 9 {
		t.Fatalf("a lagging read installed revision %d", got)
	}

	// The database replaced: the service serves revision 2 from now on.
	stub.set(2)
	announce(2)
	at(2)
	stub.set(3)
	announce(3)
	at(3)
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[2[] 3[rev]]" {
		t.Fatalf("watchers saw %v", seen)
	}
}

// A new history (the config database replaced) that stands at the very
// revision number read was never read: numbers were compared alone, and
// the old document was kept for ever. A different history id, announced
// or served, is now installed whatever the number; an announcement or a
// service without one (an older peer) keeps the number rules.
func TestHistoryAtTheSameRevisionIsFollowed(t *testing.T) {
	stub := &liveStub{rev: 5, hist: "a"}
	c, nc := follow(t, stub)
	var mu sync.Mutex
	var seen []string
	c.OnChange(func(s configclient.Snapshot, props []string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%d%s%v", s.Revision, s.History, props))
	})
	at := func(rev int64, hist string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, 5*time.Millisecond, func() error {
			if got := c.Current(); got.Revision != rev || got.History != hist || got.String("hist") != hist {
				return fmt.Errorf("at revision %d of history %q (%v), want %d of %q", got.Revision, got.History, got.Document, rev, hist)
			}
			return nil
		})
	}
	at(5, "a")

	// An older peer's announcement (no id) of the same number: nothing
	// to read, as before.
	stub.mu.Lock()
	stub.hist = "b"
	before := stub.calls
	stub.mu.Unlock()
	if err := bus.PublishConfigChanged(nc, 5, nil); err != nil {
		t.Fatal(err)
	}
	// The new history's announcement, same number: read and installed.
	if err := bus.PublishConfigRevision(nc, "b", "", "", 5, []string{"rev"}); err != nil {
		t.Fatal(err)
	}
	at(5, "b")
	stub.mu.Lock()
	if n := stub.calls - before; n != 1 {
		t.Errorf("%d reads for the two announcements, want 1 (the one with another history)", n)
	}
	stub.mu.Unlock()
	// Then on as usual.
	stub.set(6)
	if err := bus.PublishConfigRevision(nc, "b", "", "", 6, []string{"rev"}); err != nil {
		t.Fatal(err)
	}
	at(6, "b")
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[5b[] 6b[rev]]" {
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

// AtLeast reads a revision committed but not announced (a client's own
// write, its announcement late) instead of waiting for the announcement
// or the 30 s resync; a revision the config service does not serve (a
// forged number, another history's) costs a waiter two reads at most,
// then an error, and one already read costs none.
func TestAtLeastReadsTheRevisionAskedFor(t *testing.T) {
	stub := &liveStub{rev: 3}
	c, _ := follow(t, stub)
	ctx := t.Context()
	calls := func() int { stub.mu.Lock(); defer stub.mu.Unlock(); return stub.calls }

	stub.set(5) // committed, never announced
	if err := c.AtLeast(ctx, 5); err != nil {
		t.Fatalf("AtLeast(5) with 5 served: %v", err)
	}
	if c.Current().Revision != 5 {
		t.Fatalf("after AtLeast(5): revision %d", c.Current().Revision)
	}
	before := calls()
	if err := c.AtLeast(ctx, 4); err != nil {
		t.Fatalf("AtLeast(4) with 5 read: %v", err)
	}
	if n := calls() - before; n != 0 {
		t.Fatalf("AtLeast of a revision read made %d reads", n)
	}
	before = calls()
	err := c.AtLeast(ctx, 99)
	if !errors.Is(err, configclient.ErrRevisionNotRead) {
		t.Fatalf("AtLeast(99) with 5 served: %v, want ErrRevisionNotRead", err)
	}
	if n := calls() - before; n > 2 {
		t.Fatalf("AtLeast of a revision not served made %d reads, want 2 at most", n)
	}
}

// Latest reads the revision served when it was called, committed but
// not announced (another client's write, its announcement late), and
// each Latest takes a read begun after it asked: one with nothing
// changed since still reads once, and finds the same revision. Before,
// a caller with no revision of its own had only what the bus had
// announced.
func TestLatestReadsTheRevisionServedNow(t *testing.T) {
	stub := &liveStub{rev: 3}
	c, _ := follow(t, stub)
	ctx := t.Context()
	calls := func() int { stub.mu.Lock(); defer stub.mu.Unlock(); return stub.calls }

	stub.set(7) // committed, never announced
	if err := c.Latest(ctx); err != nil {
		t.Fatalf("Latest with 7 served: %v", err)
	}
	if got := c.Current(); got.Revision != 7 || got.String("rev") != "7" {
		t.Fatalf("after Latest with 7 served: revision %d (%q)", got.Revision, got.String("rev"))
	}
	before := calls()
	if err := c.Latest(ctx); err != nil {
		t.Fatalf("Latest with nothing new: %v", err)
	}
	if n := calls() - before; n != 1 {
		t.Fatalf("Latest with nothing new made %d reads, want the one it asked for", n)
	}
	if c.Current().Revision != 7 {
		t.Fatalf("after a second Latest: revision %d", c.Current().Revision)
	}
}

// follow is a config client following stub over the tests' NATS server,
// and its connection (to announce revisions on), both closed at the
// test's end.
func follow(t *testing.T, stub *liveStub) (*configclient.Client, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := configclient.New(ctx, stub, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, nc
}
