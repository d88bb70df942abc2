package service

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testenv"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// hungConfig holds every Live until its caller gives up, as a stopped
// config service does, until answer is set.
type hungConfig struct {
	configv1.ConfigServiceClient
	answer atomic.Bool
	calls  atomic.Int64
}

func (h *hungConfig) Live(ctx context.Context, _ *configv1.LiveRequest, _ ...grpc.CallOption) (*configv1.LiveResponse, error) {
	h.calls.Add(1)
	if !h.answer.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	doc, err := structpb.NewStruct(map[string]any{})
	return &configv1.LiveResponse{Revision: 7, Document: doc}, err
}

// A start waits for a config service that does not answer for as long
// as it takes, attempt after attempt, health saying so, and goes on once
// config answers; a stop ends the wait, saying so.
func TestAwaitConfigWaitsPastItsAttempts(t *testing.T) {
	old := configAttempt
	configAttempt = 50 * time.Millisecond
	t.Cleanup(func() { configAttempt = old })
	nc, err := nats.Connect(testenv.NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	core, logs := observer.New(zap.InfoLevel)
	env := &Env{Log: zap.New(core), Server: grpcserver.New(zap.NewNop(), 0), NATS: nc}
	env.Server.SetStarting("setting up its services")

	cfg := &hungConfig{}
	type result struct {
		rev int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		live, err := env.AwaitConfig(context.Background(), cfg)
		if err != nil {
			got <- result{err: err}
			return
		}
		defer live.Close()
		got <- result{rev: live.Current().Revision}
	}()
	testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() error {
		select {
		case r := <-got:
			t.Fatalf("the wait ended with config hung: %+v", r)
		default:
		}
		if n := logs.FilterMessageSnippet("still waiting").Len(); n < 3 {
			return errors.New("fewer than 3 attempts logged")
		}
		return nil
	})
	if r := env.Server.Reason(); r != "starting: "+StartingConfig {
		t.Fatalf("health's reason while config is hung: %q", r)
	}
	cfg.answer.Store(true)
	r := <-got
	if r.err != nil || r.rev != 7 {
		t.Fatalf("once config answers: %+v", r)
	}
	if r := env.Server.Reason(); r != "starting: setting up its services" {
		t.Fatalf("health's reason once config answered: %q", r)
	}

	// A stop while config is hung ends the wait.
	cfg.answer.Store(false)
	before := cfg.calls.Load()
	ctx, cancel := context.WithCancelCause(context.Background())
	stopped := make(chan error, 1)
	go func() {
		_, err := env.AwaitConfig(ctx, cfg)
		stopped <- err
	}()
	testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() error {
		if cfg.calls.Load() == before {
			return errors.New("not asked again yet")
		}
		return nil
	})
	cancel(ErrShutdown)
	if err := <-stopped; err == nil || !strings.Contains(err.Error(), "stopped while waiting for it (service shutting down)") {
		t.Fatalf("a stop while waiting: %v", err)
	}
}
