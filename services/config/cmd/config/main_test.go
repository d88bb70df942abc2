package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"encoding/json"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/service"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A bad --set makes the config process stop at start, before it serves,
// with an error naming the property and what is wrong.
func TestBadStartupSetStopsTheProcess(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := bus.EnsureCredentials(dir); err != nil {
		t.Fatal(err)
	}
	t.Setenv(service.EnvDatabaseURL, testenv.Postgres(t))
	for set, want := range map[string]string{
		"rpc.max_local_connections=lots": "--set rpc.max_local_connections",
		"rpc.no_such_limit=1":            "unknown config property `rpc.no_such_limit`",
	} {
		sets, _ := json.Marshal([]string{"rpc.max_frame_bytes=65536", set})
		t.Setenv(EnvStartupSets, string(sets))
		err := service.Run(ctx, spec(), []string{
			"--config-dir", dir, "--listen", filepath.Join(dir, "config.sock"), "--nats-url", testenv.NATS(t),
		})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want an error containing %q", set, err, want)
		}
	}
}
