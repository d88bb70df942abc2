package launcher

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/service"
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
	dir, bin := privateDir(t), stubBinaries(t)
	procs, release, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", "nats://127.0.0.1:4222", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
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
// Each child is passed what the launcher hands it, and nothing else: its
// gRPC socket at its first run (a dormant one's at every run), the
// gateway its client socket at every run.
func TestPlanPassesNoInheritedDescriptors(t *testing.T) {
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_FDNAMES", listenfd.GRPCSocket)
	t.Setenv("LISTEN_PID", "")
	dir, bin := privateDir(t), stubBinaries(t)
	staging, err := holdStaging(dir, zap.NewNop())
	if err != nil || staging == nil {
		t.Fatalf("upload-staging socket not held: %v", err)
	}
	t.Cleanup(staging.release)
	client, err := os.Open(os.DevNull) // stands for the client socket
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	procs, release, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", "nats://127.0.0.1:4222", client, []*dormant{staging})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	for _, p := range procs {
		for run := 1; run <= 2; run++ {
			cmd := p.command()
			p.started()
			got := map[string][]string{}
			for _, kv := range cmd.Env {
				k, v, _ := strings.Cut(kv, "=")
				if strings.HasPrefix(k, "LISTEN_") {
					got[k] = append(got[k], v)
				}
			}
			var want map[string][]string
			switch {
			case p.name == UploadStaging:
				want = map[string][]string{"LISTEN_FDS": {"1"}, "LISTEN_FDNAMES": {listenfd.GRPCSocket}}
			case p.name == "gateway" && run == 1:
				want = map[string][]string{"LISTEN_FDS": {"2"}, "LISTEN_FDNAMES": {listenfd.ClientSocket + ":" + listenfd.GRPCSocket}}
			case p.name == "gateway":
				want = map[string][]string{"LISTEN_FDS": {"1"}, "LISTEN_FDNAMES": {listenfd.ClientSocket}}
			case run == 1:
				want = map[string][]string{"LISTEN_FDS": {"1"}, "LISTEN_FDNAMES": {listenfd.GRPCSocket}}
			}
			if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Errorf("%s, run %d: passed %v, want %v", p.name, run, got, want)
			}
			wantFiles := "0"
			if len(want) > 0 {
				wantFiles = want["LISTEN_FDS"][0]
			}
			if n := strconv.Itoa(len(cmd.ExtraFiles)); n != wantFiles {
				t.Errorf("%s, run %d: %s descriptors handed, want %s", p.name, run, n, wantFiles)
			}
		}
	}
}

// A process's first run is handed its gRPC socket already listening, so
// that a client (the launcher's readiness check) connects before the
// process serves and is answered once it does, with no retry. The
// launcher drops its copy once the run has started: with the process
// gone, a connection is refused at once. release removes the socket.
func TestFirstRunIsHandedItsListeningSocket(t *testing.T) {
	dir, bin := privateDir(t), stubBinaries(t)
	procs, release, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", "nats://127.0.0.1:4222", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var config *proc
	for _, p := range procs {
		if p.name == "config" {
			config = p
		}
	}
	sock := datadir.ServiceSocket(dir, "config", 0)
	// Before any run, a client's connection waits in the backlog.
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatalf("the config socket does not listen before its first run: %v", err)
	}
	c.Close()
	cmd := config.command()
	if len(cmd.ExtraFiles) != 1 {
		t.Fatalf("first run handed %d descriptors", len(cmd.ExtraFiles))
	}
	// The run holds its copy (here: the test, standing for the child).
	ln, err := net.FileListener(cmd.ExtraFiles[0])
	if err != nil {
		t.Fatal(err)
	}
	config.started()
	c, err = net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := ln.Accept(); err != nil {
		t.Fatal(err)
	} else {
		a.Close()
	}
	c.Close()
	// The run gone, nothing holds the socket any more: refused at once.
	ln.Close()
	if c, err := net.DialTimeout("unix", sock, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the socket still listens once its run is gone: the launcher kept a copy")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after the run: %v, want connection refused", err)
	}
	if cmd := config.command(); len(cmd.ExtraFiles) != 0 {
		t.Fatalf("a later run was handed %d descriptors", len(cmd.ExtraFiles))
	}
	release()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after release: %v", err)
	}
}

// stubBinaries is a folder with an empty file for every process's
// binary: plan checks they exist, and these tests start none.
func stubBinaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	for _, p := range stack.Processes {
		if err := os.WriteFile(filepath.Join(bin, p.Name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// An operator's NATS_URL may carry a token or a user and password, which
// nats.go uses; the launcher put it on every child's command line, which
// any local user reads in /proc/<pid>/cmdline. It travels in the
// environment now, as the database URL does.
func TestBusURLNotOnACommandLine(t *testing.T) {
	dir, bin := privateDir(t), stubBinaries(t)
	const url = "nats://s3cret-token@nats.example:4222"
	procs, release, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", url, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	for _, p := range procs {
		cmd := p.command()
		if a := strings.Join(cmd.Args, " "); strings.Contains(a, "s3cret-token") {
			t.Fatalf("%s: the bus URL on its command line: %s", p.name, a)
		}
		if !slices.Contains(cmd.Env, "NATS_URL="+url) {
			t.Fatalf("%s: no NATS_URL in its environment", p.name)
		}
	}
}

// A binary missing from the stack's folder (a build cut short, one file
// removed) panicked the launcher: plan's early return set its release
// to nil, which its deferred clean-up then called. The launcher says
// which binary is missing and what to do, and releases the sockets it
// had bound.
func TestPlanWithABinaryMissing(t *testing.T) {
	dir, bin := privateDir(t), stubBinaries(t)
	last := stack.Processes[len(stack.Processes)-1].Name
	if err := os.Remove(filepath.Join(bin, last)); err != nil {
		t.Fatal(err)
	}
	_, release, err := plan(Config{DataDir: dir, BinDir: bin}, "postgres:///x", "nats://127.0.0.1:4222", nil, nil)
	if err == nil || release != nil || !strings.Contains(err.Error(), last+" binary") || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("plan without the %s binary: %v", last, err)
	}
	// The sockets bound for the processes before it are released.
	if socks, _ := filepath.Glob(filepath.Join(dir, "*.sock")); len(socks) != 0 {
		t.Fatalf("sockets left bound: %v", socks)
	}
}

// --set overrides reach the config service in its environment. One
// variable longer than Linux's MAX_ARG_STRLEN (131072 bytes) failed the
// start ("fork/exec .../config: argument list too long"): a --set-file
// with a system prompt of 140 KB could not start the stack. They are cut
// into pieces the config service joins; overrides past what a process's
// environment can hold are refused before anything starts, saying so; an
// inherited piece is not passed on.
func TestLargeStartupSetsReachTheConfigService(t *testing.T) {
	t.Setenv(service.EnvStartupSets+"_7", "stale")
	dir, bin := privateDir(t), stubBinaries(t)
	if err := os.WriteFile(filepath.Join(bin, "config"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sets := []string{"agents.default.system_prompt=" + strings.Repeat("long prompt ", 25000), "rpc.max_local_connections=64"}
	procs, release, err := plan(Config{DataDir: dir, BinDir: bin, Sets: sets}, "postgres:///x", "nats://127.0.0.1:4222", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	for _, p := range procs {
		if p.name != "config" {
			continue
		}
		cmd := p.command()
		if err := cmd.Run(); err != nil {
			t.Fatalf("config with %d bytes of --set: %v", len(sets[0]), err)
		}
		env := map[string]string{}
		for _, kv := range cmd.Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		if _, ok := env[service.EnvStartupSets+"_7"]; ok {
			t.Error("an inherited piece of --set overrides was passed on")
		}
		got, err := service.StartupSets(func(k string) string { return env[k] })
		if err != nil || !reflect.DeepEqual(got, sets) {
			t.Fatalf("the config service reads %d sets (%v), want the %d passed", len(got), err, len(sets))
		}
	}
	huge := Config{DataDir: dir, BinDir: bin, Sets: []string{"agents.default.system_prompt=" + strings.Repeat("x", service.MaxStartupSetsBytes)}}
	if err := huge.withDefaults(); err == nil || !strings.Contains(err.Error(), "set the larger ones with config/set once the stack is up") {
		t.Fatalf("overrides past the bound: %v", err)
	}
}

// The --set overrides go to the config service's runs until one has
// served, not to a later run (after a crash), which would commit them
// again over every config/set made since the start.
func TestStartupSetsOnlyUntilConfigServed(t *testing.T) {
	dir, bin := privateDir(t), stubBinaries(t)
	procs, release, err := plan(Config{DataDir: dir, BinDir: bin, Sets: []string{"agents.default.model=m"}},
		"postgres:///x", "nats://127.0.0.1:4222", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	hasSets := func(cmd *exec.Cmd) bool { return slices.ContainsFunc(cmd.Env, service.IsStartupSets) }
	for _, p := range procs {
		if got := hasSets(p.command()); got != (p.name == "config") {
			t.Errorf("%s's first run given --set overrides: %v", p.name, got)
		}
		p.served()
		if hasSets(p.command()) {
			t.Errorf("%s's run after one served given --set overrides", p.name)
		}
	}
}
