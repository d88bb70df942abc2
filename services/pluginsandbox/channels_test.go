package pluginsandbox_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/internal/testwait"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// A list of the channel bindings is answered while a rescan stops one:
// a binding's stop waits up to 5 s for its listener's requests (and its
// load compiles a plugin), and plugins/list, which the gateway gives 5 s,
// timed out behind it on a loaded machine.
func TestChannelsListedWhileABindingStops(t *testing.T) {
	dir := t.TempDir()
	installExample(t, dir, "webhook")
	ts := newTestServer(t, dir)
	ts.live.set(func(l *pluginsandbox.Live) {
		l.Channels = map[string]pluginsandbox.ChannelBinding{
			"web": {Alias: "web", Plugin: "webhook", Listen: "127.0.0.1:0"},
		}
	})
	ts.rescan(t)
	listed, err := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed.Channels) != 1 || listed.Channels[0].Listen == "" {
		t.Fatalf("channels %v, want web listening", listed.Channels)
	}
	addr := listed.Channels[0].Listen

	// A request that never finishes its headers holds the listener's
	// graceful stop for its 5 s, once accepted: one still in the listen
	// queue when the listener closed let the stop end at once on a busy
	// machine, and the test took that for a list waiting behind it. A
	// whole request on a second connection, answered, is the barrier: the
	// server accepts in the order connections came.
	hold, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if _, err := hold.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	barrier, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := barrier.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := http.ReadResponse(bufio.NewReader(barrier), nil); err != nil {
		t.Fatal(err)
	}
	barrier.Close()

	ts.live.set(func(l *pluginsandbox.Live) { l.Channels = nil })
	rescanned := make(chan struct{})
	go func() {
		defer close(rescanned)
		_ = ts.Rescan(context.Background())
	}()
	// The stop has begun once the listener refuses connections.
	testenv.Eventually(t, testwait.Bound, 10*time.Millisecond, func() error {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil
		}
		c.Close()
		return errors.New("the binding's listener still accepts after its removal")
	})
	answered := make(chan *pluginv1.ListChannelsResponse, 1)
	go func() {
		l, _ := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{})
		answered <- l
	}()
	// 2 s is well inside the stop's 5 s: a list that waits for the stop
	// cannot come in time, one that does not comes at once.
	select {
	case l := <-answered:
		if len(l.Channels) != 1 || l.Channels[0].Alias != "web" {
			t.Fatalf("channels while web stops: %v, want web still listed", l.Channels)
		}
	case <-rescanned:
		t.Fatal("ListChannels waited for the rescan that stops a binding")
	case <-time.After(2 * time.Second):
		t.Fatal("ListChannels waited behind a binding's stop")
	}
	hold.Close()
	testwait.Recv(t, rescanned)
	if l, _ := ts.ListChannels(context.Background(), &pluginv1.ListChannelsRequest{}); len(l.Channels) != 0 {
		t.Fatalf("channels after the removal: %v", l.Channels)
	}
}
