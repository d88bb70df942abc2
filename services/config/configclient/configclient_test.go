package configclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
	"github.com/clawmesh/clawmesh/services/config/configclient"
)

// liveStub answers Live with a settable revision; the config service's
// own tests run the client against the real service.
type liveStub struct {
	configv1.ConfigServiceClient
	mu  sync.Mutex
	rev int64
}

func (l *liveStub) set(rev int64) { l.mu.Lock(); l.rev = rev; l.mu.Unlock() }

func (l *liveStub) Live(context.Context, *configv1.LiveRequest, ...grpc.CallOption) (*configv1.LiveResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	doc, _ := structpb.NewStruct(map[string]any{"rev": fmt.Sprint(l.rev)})
	return &configv1.LiveResponse{Revision: l.rev, Document: doc}, nil
}

// Changes apply in revision order: older ones are dropped, and a gap is
// filled from Live.
func TestRevisionOrder(t *testing.T) {
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
	if c.Current().Revision != 3 || c.Current().String("rev", "") != "3" {
		t.Fatalf("start: %+v", c.Current())
	}
	var mu sync.Mutex
	var seen []int64
	c.OnChange(func(s configclient.Snapshot, props []string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s.Revision)
	})
	publish := func(rev int64) {
		raw, _ := json.Marshal(configclient.Change{Revision: rev, Props: []string{"rev"}, Document: map[string]any{"rev": fmt.Sprint(rev)}})
		if err := nc.Publish(configclient.Subject, raw); err != nil {
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
	publish(2) // older than Live: dropped
	publish(4)
	at(4)
	stub.set(7)
	publish(6) // 5 was missed: Live fills the gap
	at(7)
	publish(7) // already there
	publish(8)
	at(8)
	if c.Current().String("rev", "") != "8" {
		t.Fatalf("document %v", c.Current().Document)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[4 7 8]" {
		t.Fatalf("watchers saw %v", seen)
	}
}
