package durablebridge

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/collietest"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/services/durablebridge/migrations"
)

func TestMain(m *testing.M) {
	if actAsCaller() {
		return
	}
	testenv.Main(m)
}

const testEpoch = "00112233445566778899aabbccddeeff"

// wireBridge is a Bridge with its layout and the wire's HTTP handler on a
// real private socket, without a session service: enough for every rule
// the handler applies before a route runs, and for the GET routes the
// layout answers. With a database it remembers request ids.
type wireBridge struct {
	b      *Bridge
	socket string
}

func newWireBridge(t testing.TB, withDB bool) *wireBridge {
	t.Helper()
	return newWireBridgeWith(t, withDB, nil)
}

// newWireBridgeWith is newWireBridge with setup run on the Bridge before
// it serves (a field set later races with the handler that reads it).
func newWireBridgeWith(t testing.TB, withDB bool, setup func(b *Bridge)) *wireBridge {
	t.Helper()
	b := &Bridge{
		cfg:    Config{Log: testenv.Logger(t), HostName: "test host", RefuseDescendants: func() bool { return false }, CallTimeout: time.Second},
		log:    testenv.Logger(t),
		layout: NewLayout(testEpoch),
		base:   context.Background(),
	}
	b.launcher = launcherPID()
	b.follower = newFollower(b)
	if withDB {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A copy of a database migrated once a process, where each
		// test applied every migration anew (testenv.PostgresPrepared).
		url := testenv.PostgresPrepared(t, "durable", func(ctx context.Context, url string) error {
			pool, err := pg.Open(ctx, url, "durable", migrations.FS, zap.NewNop())
			if err != nil {
				return err
			}
			pool.Close()
			return nil
		})
		pool, err := pg.Open(ctx, url, "durable", migrations.FS, b.log)
		if err != nil {
			t.Fatalf("open database: %v", err)
		}
		t.Cleanup(pool.Close)
		b.store = &store{db: pool}
		b.memory = newRequestMemory(b.store, testEpoch, b.log)
	}
	if setup != nil {
		setup(b)
	}
	w := &wireBridge{b: b, socket: filepath.Join(t.TempDir(), "private", "durable.sock")}
	ln, err := durablesock.ListenSocket(w.socket)
	if err != nil {
		t.Fatal(err)
	}
	w.serve(t, boundConns(ln, socketConns), overSocket, "")
	return w
}

func (w *wireBridge) serve(t testing.TB, ln net.Listener, tr transport, prefix string) {
	srv := w.b.httpServer(tr, prefix)
	done := make(chan struct{})
	go func() { defer close(done); _ = serveWire(srv, ln, tr) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
}

// collie is a Collie client of the socket, hello done when ready.
func (w *wireBridge) collie(t testing.TB) *collietest.Client {
	c := collietest.Socket(w.socket)
	t.Cleanup(c.Close)
	return c
}

// addPane puts a pane with n items and the given asks in the layout.
func (w *wireBridge) addPane(id, alias string, items int, asks ...*ask) {
	p := newPane(id, alias, time.Now())
	for i := range items {
		p.putItem(fmt.Sprintf("m%d", i), kindUser, fmt.Sprintf("item %d", i), time.Now(), false)
	}
	for _, a := range asks {
		p.addAsk(a)
	}
	if len(asks) > 0 {
		p.turn = &turnInfo{id: "turn-1", started: time.Now()}
	}
	w.b.layout.put(p)
}

func testAsk(paneID, toolCallID string) *ask {
	return &ask{id: askID(paneID, toolCallID), requestID: "ap_" + toolCallID, toolCallID: toolCallID, toolName: "echo",
		turnID: "turn-1", args: json.RawMessage(`{"x":1}`), revision: 1, created: time.Now(), expires: time.Now().Add(time.Hour)}
}

// raw sends a request with exactly the headers given.
func raw(t testing.TB, c *collietest.Client, method, path string, hdr http.Header, body []byte) *collietest.Reply {
	t.Helper()
	r, err := c.Do(context.Background(), method, path, hdr, body, 5*time.Second, 0)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func want(t testing.TB, r *collietest.Reply, status int, code string) {
	t.Helper()
	if r.Status != status || r.Code() != code {
		t.Fatalf("want %d %q, got %s", status, code, r)
	}
}

func v1() http.Header { return http.Header{"X-Collie-Session": {"1"}} }
