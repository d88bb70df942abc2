package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
	busv1 "github.com/clawmesh/clawmesh/proto/clawmesh/bus/v1"
)

// initializedConns lists the gateway's connection ids in the order they
// initialized, from its audit log.
func initializedConns(t *testing.T, s *e2e.Stack) []string {
	t.Helper()
	var ids []string
	for _, line := range strings.Split(readLog(t, s, "gateway"), "\n") {
		var entry struct {
			Msg  string `json:"msg"`
			Conn string `json:"conn"`
			PID  int32  `json:"peer_pid"`
			UID  int32  `json:"peer_uid"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "connection initialized" {
			if entry.PID <= 0 || entry.UID < 0 {
				t.Fatalf("audit line without peer credentials: %s", line)
			}
			ids = append(ids, entry.Conn)
		}
	}
	return ids
}

// A service asks a client something through the gateway (bus.Ask):
// the request goes out as zc-out-<n>, the client's answer comes back;
// elicitation only to clients that advertised it.
func TestAskThroughTheGateway(t *testing.T) {
	t.Parallel()
	natsURL := testenv.NATS(t)
	s := e2e.Start(t, e2e.Options{Env: []string{"NATS_URL=" + natsURL}})
	withElicit := s.Dial(t)
	if _, err := withElicit.Call("initialize", map[string]any{"protocol_version": 1, "client_capabilities": map[string]any{"elicitation": map[string]any{}}}); err != nil {
		t.Fatal(err)
	}
	without := s.Dial(t)
	if _, err := without.Initialize(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if ids = initializedConns(t, s); len(ids) != 2 {
			return fmt.Errorf("connections in the log: %v", ids)
		}
		return nil
	})
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()

	// The client answers with an explicit null: that resolves the ask.
	type answer struct {
		raw json.RawMessage
		err error
	}
	got := make(chan answer, 1)
	go func() {
		raw, err := bus.Ask(ctx, nc, ids[0], "elicitation/create", map[string]any{"message": "Continue?"}, 10*time.Second)
		got <- answer{raw, err}
	}()
	f, line, err := withElicit.Read(10 * time.Second)
	if err != nil || f.Method != "elicitation/create" || string(f.ID) != `"zc-out-0"` {
		t.Fatalf("outgoing request %s %v", line, err)
	}
	withElicit.Send(`{"jsonrpc":"2.0","id":"zc-out-0","result":null}`)
	if a := <-got; a.err != nil || string(a.raw) != "null" {
		t.Fatalf("ask answered %s %v", a.raw, a.err)
	}

	// An error reply comes back as the client's error; the next id counts on.
	go func() {
		raw, err := bus.Ask(ctx, nc, ids[0], "ping", nil, 10*time.Second)
		got <- answer{raw, err}
	}()
	f, _, err = withElicit.Read(10 * time.Second)
	if err != nil || string(f.ID) != `"zc-out-1"` {
		t.Fatalf("second outgoing request: %+v %v", f, err)
	}
	withElicit.Send(`{"jsonrpc":"2.0","id":"zc-out-1","error":{"code":-32601,"message":"Unknown method: ping"}}`)
	var ae *bus.AskError
	if a := <-got; !errors.As(a.err, &ae) || ae.Failure != busv1.AskFailure_ASK_FAILURE_CLIENT_ERROR || ae.Code != -32601 {
		t.Fatalf("error reply: %v", a.err)
	}

	// No elicitation to a client that did not advertise it: it sees nothing.
	_, err = bus.Ask(ctx, nc, ids[1], "elicitation/create", map[string]any{"message": "x"}, 2*time.Second)
	if !errors.As(err, &ae) || ae.Failure != busv1.AskFailure_ASK_FAILURE_NOT_ADVERTISED {
		t.Fatalf("elicitation to a client without the capability: %v", err)
	}
	if _, err := without.Call("health", nil); err != nil {
		t.Fatalf("the client without elicitation received something: %v", err)
	}

	// An unanswered ask times out; a closed connection cannot be asked.
	_, err = bus.Ask(ctx, nc, ids[0], "ping", nil, 300*time.Millisecond)
	if !errors.As(err, &ae) || ae.Failure != busv1.AskFailure_ASK_FAILURE_NO_ANSWER {
		t.Fatalf("unanswered ask: %v", err)
	}
	without.Close()
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		_, err := bus.Ask(ctx, nc, ids[1], "ping", nil, time.Second)
		if !errors.Is(err, bus.ErrNoConnection) {
			return fmt.Errorf("ask to a closed connection: %v", err)
		}
		return nil
	})
}
