package launcher

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/stack"
)

// Every child is told every peer's socket in the data directory, so a
// CLAWMESH_*_ADDR in the launcher's environment cannot send the gateway
// past a dormant process's held socket (it would never wake) or any
// process elsewhere than the stack's own.
func TestPlanNamesEveryPeerSocket(t *testing.T) {
	for _, env := range []string{"CLAWMESH_CONFIG_ADDR", "CLAWMESH_SESSION_ADDR", "CLAWMESH_UPLOAD_ADDR", "CLAWMESH_DURABLE_ADDR", "CLAWMESH_PLUGIN_ADDR"} {
		t.Setenv(env, "127.0.0.1:1")
	}
	dir, bin := privateDir(t), t.TempDir()
	for _, p := range stack.Processes {
		if err := os.WriteFile(filepath.Join(bin, p.Name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	procs, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", "nats://127.0.0.1:4222", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"--config-addr": "config", "--session-addr": "session", "--upload-addr": UploadStaging,
		"--durable-addr": DurableBridge, "--plugin-addr": "plugin-sandbox",
	}
	for _, p := range procs {
		args := p.command().Args
		for flag, svc := range want {
			i := slices.Index(args, flag)
			if i < 0 || i+1 >= len(args) || args[i+1] != datadir.ServiceSocket(dir, svc, 0) {
				t.Errorf("%s: %s not given as the data directory's %s socket: %q", p.name, flag, svc, args)
			}
		}
	}
}

// Descriptors passed to the launcher itself (LISTEN_FDS and the names
// beside it, without a LISTEN_PID that would tie them to the launcher)
// are not its children's: a child told it was passed "clawmesh-grpc"
// at descriptor 3 would take whatever it has open there for its socket.
// Each child is passed what the launcher hands it, and nothing else.
func TestPlanPassesNoInheritedDescriptors(t *testing.T) {
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_FDNAMES", listenfd.GRPCSocket)
	t.Setenv("LISTEN_PID", "")
	dir, bin := privateDir(t), t.TempDir()
	for _, p := range stack.Processes {
		if err := os.WriteFile(filepath.Join(bin, p.Name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	staging, err := holdStaging(dir, zap.NewNop())
	if err != nil || staging == nil {
		t.Fatalf("upload-staging socket not held: %v", err)
	}
	t.Cleanup(staging.release)
	procs, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", "nats://127.0.0.1:4222", nil, []*dormant{staging})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		cmd := p.command()
		got := map[string][]string{}
		for _, kv := range cmd.Env {
			k, v, _ := strings.Cut(kv, "=")
			if strings.HasPrefix(k, "LISTEN_") {
				got[k] = append(got[k], v)
			}
		}
		var want map[string][]string
		switch p.name {
		case UploadStaging:
			want = map[string][]string{"LISTEN_FDS": {"1"}, "LISTEN_FDNAMES": {listenfd.GRPCSocket}}
		case "gateway":
			want = map[string][]string{"LISTEN_FDS": {"1"}, "LISTEN_FDNAMES": {listenfd.ClientSocket}}
		}
		if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Errorf("%s: passed %v, want %v", p.name, got, want)
		}
		if n := len(cmd.ExtraFiles); n != len(want["LISTEN_FDS"]) {
			t.Errorf("%s: %d descriptors handed", p.name, n)
		}
	}
}
