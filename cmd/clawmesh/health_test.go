package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// serveHealth runs a process's gRPC server (health only) on a socket.
func serveHealth(t *testing.T) (*grpcserver.Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cm-h-") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "p.sock")
	srv := grpcserver.New(testenv.Logger(t), 0)
	lis, err := grpcserver.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return srv, path
}

func TestHealthExitsZeroOnlyWhenServing(t *testing.T) {
	srv, path := serveHealth(t)
	srv.SetServing("clawmesh.test.v1.Thing")

	var out bytes.Buffer
	if err := healthCmd([]string{path}, &out); err != nil {
		t.Fatalf("serving process: %v", err)
	}
	if strings.TrimSpace(out.String()) != "SERVING" {
		t.Fatalf("printed %q", out.String())
	}
	if err := healthCmd([]string{path, "--service", "clawmesh.test.v1.Thing"}, &out); err != nil {
		t.Fatalf("serving service: %v", err)
	}
	// CLAWMESH_LISTEN is the default address, as in a container.
	t.Setenv("CLAWMESH_LISTEN", path)
	if err := healthCmd(nil, &out); err != nil {
		t.Fatalf("address from CLAWMESH_LISTEN: %v", err)
	}

	// A dependency down: NOT_SERVING, with the process's reason.
	srv.SetDependency("database", errors.New("connection refused"))
	err := healthCmd([]string{path}, &out)
	if !errors.Is(err, ErrNotServing) || !strings.Contains(err.Error(), "database: connection refused") {
		t.Fatalf("database down: %v, want not serving with the reason", err)
	}
	srv.SetDependency("database", nil)
	if err := healthCmd([]string{path}, &out); err != nil {
		t.Fatalf("database back: %v", err)
	}

	// A service the process does not serve, and no process at all.
	if err := healthCmd([]string{path, "--service", "no.such.Service"}, &out); err == nil {
		t.Fatal("an unknown service passed")
	}
	if err := healthCmd([]string{filepath.Join(t.TempDir(), "none.sock")}, &out); err == nil {
		t.Fatal("no process passed")
	}
	t.Setenv("CLAWMESH_LISTEN", "")
	if err := healthCmd(nil, &out); err == nil {
		t.Fatal("no address passed")
	}
}

func TestHealthDialsWildcardsOnLoopback(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:50051":        "127.0.0.1:50051",
		":50051":               "127.0.0.1:50051",
		"[::]:50051":           "[::1]:50051",
		"config:50051":         "config:50051",
		"/data/config.sock":    "/data/config.sock",
		"dns:///sandbox:50051": "dns:///sandbox:50051",
	} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}

// A relative socket path was dialled as a host name: "no children to
// pick from", naming neither the path nor a socket. It is the socket
// under the working directory.
func TestHealthDialsARelativeSocketPath(t *testing.T) {
	srv, path := serveHealth(t)
	srv.SetServing()
	t.Chdir(filepath.Dir(path))
	var out bytes.Buffer
	if err := healthCmd([]string{filepath.Base(path)}, &out); err != nil {
		t.Fatalf("health %s in %s: %v", filepath.Base(path), filepath.Dir(path), err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"config.sock":          filepath.Join(wd, "config.sock"),
		"run/data/config.sock": filepath.Join(wd, "run/data/config.sock"),
	} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}

// What health says when it gets no health at all names what is wrong:
// it printed gRPC's framing ("rpc error: code = Unavailable desc =
// connection error: desc = \"transport: Error while dialing: dial unix
// ...: no such file or directory\"", "code = NotFound desc = unknown
// service") and, with no address, nothing of where one comes from.
func TestHealthFailuresNameTheFix(t *testing.T) {
	srv, path := serveHealth(t)
	srv.SetServing()
	var out strings.Builder
	none := filepath.Join(t.TempDir(), "none.sock")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{none}, "health " + none + ": nothing listens there: the process is not running, or listens elsewhere (its --listen or CLAWMESH_LISTEN)"},
		{[]string{path, "--service", "no.such.Service"}, `health ` + path + `: the process answers no health named "no.such.Service" (none yet while it starts, or none at all): leave --service out to ask the whole process, or ask clawmesh.liveness`},
		{nil, "health: no ADDR and no CLAWMESH_LISTEN: pass the process's socket path or host:port"},
	} {
		t.Setenv("CLAWMESH_LISTEN", "")
		err := healthCmd(tc.args, &out)
		if err == nil || err.Error() != tc.says && !strings.HasPrefix(err.Error(), tc.says) {
			t.Errorf("health %q: %v, want %q", tc.args, err, tc.says)
		}
		if err != nil && strings.Contains(err.Error(), "rpc error") {
			t.Errorf("health %q: gRPC's framing: %v", tc.args, err)
		}
	}
}
