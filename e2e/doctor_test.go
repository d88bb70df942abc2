package e2e_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
)

func doctor(t *testing.T, bin, dataDir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "clawmesh"), append([]string{"doctor", "--config-dir", dataDir}, args...)...)
	cmd.Env = append(os.Environ(), "ZEROCLAW_SOCKET=", "DATABASE_URL=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// clawmesh doctor on a running stack: the data directory, its secrets,
// the socket and every process's health; once the stack stops, the socket
// check fails and says what to do.
func TestDoctorChecksAStack(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{PrivateCluster: true})
	out, _ := doctor(t, s.BinDir, s.DataDir)
	for _, want := range []string{
		"ok    postgres",
		"ok    data directory     " + s.DataDir + " (0700, yours)",
		"ok    secret key",
		"ok    bus credential",
		"ok    socket",
		"ok    session            serving",
		"ok    config             serving",
		"ok    plugin-sandbox     serving",
		"ok    version",
		"note  plugins            " + filepath.Join(s.DataDir, "plugins") + " does not exist yet",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("doctor lacks %q:\n%s", want, out)
		}
	}

	// A plugin the sandbox refused is named with its reason; a plugins
	// folder anybody may write is refused whole, and doctor says why.
	plugins := filepath.Join(s.DataDir, "plugins")
	if err := os.MkdirAll(filepath.Join(plugins, "broken"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(plugins, "broken", "manifest.toml"), []byte("name = \"broken\"\nversion = 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for out, _ = doctor(t, s.BinDir, s.DataDir); !strings.Contains(out, "FAIL  plugin broken"); out, _ = doctor(t, s.BinDir, s.DataDir) {
		if time.Now().After(deadline) {
			t.Fatalf("doctor never named the refused plugin:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(out, "failed: ") || !strings.Contains(out, "ok    plugins            0 of 1 loaded from "+plugins) {
		t.Fatalf("doctor on a refused plugin:\n%s", out)
	}
	if err := os.Chmod(plugins, 0o777); err != nil {
		t.Fatal(err)
	}
	out, err := doctor(t, s.BinDir, s.DataDir)
	if err == nil || !strings.Contains(out, "FAIL  plugins            no plugin loads: untrusted plugin files: "+plugins+" is writable by others") {
		t.Fatalf("doctor on a plugins folder writable by all: %v\n%s", err, out)
	}
	s.Stop()
	out, err = doctor(t, s.BinDir, s.DataDir)
	if err == nil || !strings.Contains(out, "FAIL  socket") || !strings.Contains(out, "fix: clawmesh up") {
		t.Fatalf("doctor on a stopped stack: %v\n%s", err, out)
	}
}

// As root, a private cluster whose data directory is gone is stale:
// doctor names it and --fix removes it. Not parallel: every stack that
// starts its own cluster removes the stale ones it finds, this one too.
func TestDoctorFindsAndRemovesStaleClusters(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root's clusters live outside the data directory; as another user there are none to go stale")
	}
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(t.TempDir(), "removed-data-dir")
	stale := filepath.Join(pgcluster.RootClusters, "pg-0123456789abcdef01234567")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stale) })
	if err := os.WriteFile(filepath.Join(stale, "clawmesh-owner"), []byte(gone+"\n0123456789abcdef01234567\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	out, err := doctor(t, bin, data)
	if err == nil || !strings.Contains(out, "FAIL  stale clusters     "+stale+": its data directory "+gone+" is gone") ||
		!strings.Contains(out, "fix: clawmesh doctor --fix") {
		t.Fatalf("doctor did not name the stale cluster: %v\n%s", err, out)
	}
	out, _ = doctor(t, bin, data, "--fix")
	if !strings.Contains(out, "removed "+stale) {
		t.Fatalf("doctor --fix:\n%s", out)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the stale cluster is still there: %v", err)
	}
}

// clawmesh doctor in the example client container
// (deploy/k8s/examples/client.yaml), against a real stack: the image's
// environment (ZEROCLAW_DATA_DIR its own empty folder, CLAWMESH_LISTEN),
// ZEROCLAW_SOCKET, no $HOME and no PostgreSQL on PATH. It judged
// clawmesh up's needs there (PostgreSQL's binaries, the data
// directory's keys and seeds); it says now that it runs as a client and
// checks the socket, initialize and the stack's health.
func TestDoctorAsAClientOfAStack(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	data := t.TempDir()
	cmd := exec.Command(filepath.Join(s.BinDir, "clawmesh"), "doctor")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "ZEROCLAW_DATA_DIR=" + data, "ZEROCLAW_SOCKET=" + s.Socket, "CLAWMESH_LISTEN=0.0.0.0:50051"}
	raw, err := cmd.CombinedOutput()
	out := string(raw)
	if err != nil {
		t.Fatalf("doctor as a client of a healthy stack: %v\n%s", err, out)
	}
	for _, want := range []string{
		"note  client             run as a client of ZEROCLAW_SOCKET=" + s.Socket,
		"ok    socket             " + s.Socket + " answers",
		"ok    protocol           initialize answered: protocol 1, bound as ",
		"ok    session            serving",
		"ok    gateway            serving",
		"ok    version",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("doctor as a client lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		for _, up := range []string{"postgres", "data directory", "secret key", "bus credential", "stale clusters"} {
			if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(strings.Join(f[1:], " "), up+" ") {
				t.Fatalf("doctor as a client judges clawmesh up's %s:\n%s", up, out)
			}
		}
	}
}

// clawmesh doctor on a host where ZEROCLAW_SOCKET is exported and
// clawmesh up never ran: it took the socket for a stack running
// elsewhere, checked nothing of this host and said only that no gateway
// listened there. It checks clawmesh up's needs here now (up listens on
// that path too), and says what it found and both ways out.
func TestDoctorWithASocketNoStackAnswers(t *testing.T) {
	t.Parallel()
	bin, err := e2e.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	data := filepath.Join(home, "data")
	socket := filepath.Join(home, "daemon.sock")
	cmd := exec.Command(filepath.Join(bin, "clawmesh"), "doctor")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "ZEROCLAW_DATA_DIR=" + data, "ZEROCLAW_SOCKET=" + socket}
	raw, err := cmd.CombinedOutput()
	out := string(raw)
	if err == nil {
		t.Fatalf("doctor passed with no stack anywhere:\n%s", out)
	}
	for _, want := range []string{
		"note  client             ZEROCLAW_SOCKET=" + socket + " answers no stack, and none ever ran on " + data,
		"postgres ",
		"note  data directory     " + data + " does not exist yet: clawmesh up creates it",
		"FAIL  socket             " + socket + " does not exist",
		"fix: clawmesh up to run the stack on this host (it listens there), or, if the stack runs elsewhere, start the gateway that serves " + socket,
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("doctor with ZEROCLAW_SOCKET and no stack lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "run as a client of") {
		t.Fatalf("doctor took the unanswered socket for a stack elsewhere:\n%s", out)
	}
}
