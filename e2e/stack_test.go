package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

var allServices = []string{"config", "durable-bridge", "plugin-sandbox", "session", "upload-staging"}

// upServices serve once a fresh stack is up; the durable bridge sleeps
// until a Collie connects (TestDurableBridgeSleepsUntilCollieConnects),
// upload-staging until a file is sent (TestUploadStagingSleepsUntilAFileIsSent).
var upServices = []string{"config", "plugin-sandbox", "session"}

// asleep are the services a fresh stack holds dormant.
var asleep = []string{"durable-bridge", "upload-staging"}

type statusResult struct {
	ServerVersion    string            `json:"server_version"`
	ProtocolVersion  int               `json:"protocol_version"`
	ActiveSessions   int               `json:"active_sessions"`
	SessionIDs       []string          `json:"session_ids"`
	ConfigDir        string            `json:"config_dir"`
	LocalIPCEndpoint string            `json:"local_ipc_endpoint"`
	Services         map[string]string `json:"services"`
}

func status(c *e2e.Client) (statusResult, error) {
	var st statusResult
	raw, err := c.Call("status", map[string]any{})
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(raw, &st)
}

// upServing is nil once a fresh stack's services (and extra) serve and
// the others are dormant.
func upServing(c *e2e.Client, extra ...string) error {
	if err := allServing(c, append(append([]string{}, upServices...), extra...)); err != nil {
		return err
	}
	st, err := status(c)
	if err != nil {
		return err
	}
	for _, n := range asleep {
		if st.Services[n] != "dormant" {
			return fmt.Errorf("%s is %q, want dormant", n, st.Services[n])
		}
	}
	return nil
}

// allServing is nil once every named service reports serving.
func allServing(c *e2e.Client, names []string) error {
	st, err := status(c)
	if err != nil {
		return err
	}
	for _, n := range names {
		if st.Services[n] != "serving" {
			return fmt.Errorf("%s is %q (services %v)", n, st.Services[n], st.Services)
		}
	}
	return nil
}

// The main scenario: up, initialize, every service serving, one
// service killed and restarted, then a clean stop leaving nothing behind.
func TestStackUpRecoversAndStopsClean(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{PrivateCluster: true})

	// The socket is 0600 in a 0700 folder.
	assertMode(t, s.Socket, 0o600)
	assertMode(t, s.DataDir, 0o700|os.ModeDir)

	c := s.Dial(t)
	// Before initialize everything else is refused.
	if _, err := c.Call("status", map[string]any{}); !isCode(err, -32010) {
		t.Fatalf("status before initialize: %v, want -32010", err)
	}
	if _, err := c.Call("initialize", map[string]any{"protocol_version": 2}); !isCode(err, -32011) ||
		err.Error() != "rpc error -32011: Protocol version mismatch: server=1, client=2" {
		t.Fatalf("initialize v2: %v", err)
	}
	if _, err := c.Call("status", map[string]any{}); !isCode(err, -32010) {
		t.Fatalf("a refused initialize must bind nothing: %v", err)
	}
	init, err := c.Initialize()
	if err != nil {
		t.Fatal(err)
	}
	if init["principal_id"] != "shared-operator" || init["server_version"] != "0.1.0" || init["protocolVersion"] != 1.0 {
		t.Fatalf("initialize result %v", init)
	}
	caps, _ := init["capabilities"].([]any)
	if len(caps) < 3 {
		t.Fatalf("capabilities %v", caps)
	}
	if _, err := c.Call("no/such", map[string]any{}); !isCode(err, -32601) || !strings.Contains(err.Error(), "Unknown method: no/such") {
		t.Fatalf("unknown method: %v", err)
	}

	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return upServing(c) })
	// A Collie wakes the durable bridge, a call on its socket
	// upload-staging; then all five serve.
	phone(t, s)
	wakeStaging(t, s)
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return allServing(c, allServices) })
	st, err := status(c)
	if err != nil {
		t.Fatal(err)
	}
	if st.ConfigDir != s.DataDir || st.LocalIPCEndpoint != s.Socket || st.ProtocolVersion != 1 || st.SessionIDs == nil {
		t.Fatalf("status %+v", st)
	}

	// Reflection on every service socket: what grpcurl list reads.
	for _, svc := range append(allServices, "gateway") {
		names := reflectionList(t, filepath.Join(s.DataDir, svc+".sock"))
		if !contains(names, "grpc.health.v1.Health") {
			t.Errorf("%s lists %v", svc, names)
		}
	}

	// Kill the session service outright; the launcher restarts it and the
	// gateway's status recovers.
	pid := s.PIDOf("session")
	if pid == 0 {
		t.Fatalf("no session process among %v", s.PIDs())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if p := s.PIDOf("session"); p == 0 || p == pid {
			return errors.New("session not restarted yet")
		}
		return allServing(c, allServices)
	})
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		h, err := healthOf(c)
		if err != nil {
			return err
		}
		if h["session"].RestartCount != 1 || h["session"].Status != "serving" {
			return fmt.Errorf("session component %+v", h["session"])
		}
		return nil
	})
	if !strings.Contains(s.Stderr(), "process exited, restarting") {
		t.Errorf("the launcher did not log the restart")
	}

	// A gateway started again was not subscribed when the session's
	// restart was announced: the count reaches it all the same.
	gw := s.PIDOf("gateway")
	if err := syscall.Kill(gw, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		if p := s.PIDOf("gateway"); p == 0 || p == gw {
			return errors.New("gateway not restarted yet")
		}
		return nil
	})
	c.Close()
	c = s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		h, err := healthOf(c)
		if err != nil {
			return err
		}
		if n := h["session"].RestartCount; n != 1 {
			return fmt.Errorf("the new gateway says the session restarted %d times, want 1", n)
		}
		return nil
	})

	// Stop: nothing of the stack is left, no socket file either.
	before := s.PIDs()
	if len(before) < 7 {
		t.Fatalf("expected postgres, five services and the gateway, got %v", before)
	}
	s.Stop()
	if code := s.ExitCode(); code != 0 {
		t.Fatalf("launcher exit code %d:\n%s", code, s.Stderr())
	}
	if left := s.PIDs(); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
	socks, _ := filepath.Glob(filepath.Join(s.DataDir, "*.sock"))
	if len(socks) > 0 {
		t.Fatalf("socket files left behind: %v", socks)
	}
}

// Two stacks on two data directories run side by side; a second launcher
// on a data directory in use refuses with a clear message. The second
// stack also carries --set and --scale.
func TestTwoStacksSideBySide(t *testing.T) {
	t.Parallel()
	a := e2e.Start(t, e2e.Options{PrivateCluster: true})
	b := e2e.Start(t, e2e.Options{PrivateCluster: true, Args: []string{
		"--set", "rpc.advertised_server_version=9.9.9",
		"--scale", "plugin-sandbox=2",
	}})
	ca, cb := a.Dial(t), b.Dial(t)
	ia, err := ca.Initialize()
	if err != nil {
		t.Fatal(err)
	}
	ib, err := cb.Initialize()
	if err != nil {
		t.Fatal(err)
	}
	if ia["server_pid"] == ib["server_pid"] {
		t.Fatalf("both sockets reached the same gateway")
	}
	if ib["server_version"] != "9.9.9" || ia["server_version"] != "0.1.0" {
		t.Fatalf("server versions %v and %v", ia["server_version"], ib["server_version"])
	}
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return upServing(ca) })
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return upServing(cb, "plugin-sandbox.1") })

	// The same data directory twice: refused, and the first stack unharmed.
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dup, err := e2e.Launch(t, bin, a.DataDir)
	if err == nil {
		dup.Stop()
		t.Fatal("a second stack on the same data directory started")
	}
	if !strings.Contains(err.Error(), "already running on this data directory") {
		t.Fatalf("refusal message: %v", err)
	}
	if err := upServing(ca); err != nil {
		t.Fatalf("first stack after the refused duplicate: %v", err)
	}
}

func reflectionList(t *testing.T, socket string) []string {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("reflection on %s: %v", socket, err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection on %s: %v", socket, err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	sort.Strings(names)
	return names
}

func isCode(err error, code int64) bool {
	var re *e2e.RPCError
	return errors.As(err, &re) && re.Code == code
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (os.ModePerm | os.ModeDir); got != want {
		t.Errorf("%s mode %v, want %v", path, got, want)
	}
}

// A bad --set is refused before anything starts; a service that cannot
// start fails the launch at once, naming it, instead of after a timeout.
func TestBadStartRefusedClearly(t *testing.T) {
	t.Parallel()
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	for _, d := range []string{"a", "b"} {
		// Root's clusters live outside the data directory.
		t.Cleanup(func() { os.RemoveAll(pgcluster.Dir(filepath.Join(base, d))) })
	}
	if _, err := e2e.Launch(t, bin, filepath.Join(base, "a"), "--set", "rpc.max_local_connections=lots"); err == nil ||
		!strings.Contains(err.Error(), "--set rpc.max_local_connections") {
		t.Fatalf("bad --set: %v", err)
	}
	// Passes the CLI's check, fails the whole-document check in the config
	// service: a user naming a profile that does not exist.
	_, err = e2e.Launch(t, bin, filepath.Join(base, "b"), "--set", `users.ann.permission_profiles=["ghost"]`)
	if err == nil || !strings.Contains(err.Error(), "config exited during start") {
		t.Fatalf("config refusing its --set: %v", err)
	}
}
