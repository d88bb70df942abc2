package launcher

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/internal/datadir"
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
