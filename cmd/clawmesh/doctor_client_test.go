package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/pgcluster"
)

// clientLayout builds the client container of
// deploy/k8s/examples/client.yaml: the image's environment
// (ZEROCLAW_DATA_DIR=/data, its own empty 0700 folder; CLAWMESH_LISTEN),
// ZEROCLAW_SOCKET on the volume it shares with its gateway sidecar, and
// nothing of the stack's (no service address, database, bus or seed).
// It returns the socket, which a gateway serves.
func clientLayout(t *testing.T) string {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := fakeSocket(t, func(conn net.Conn) { servePlugins(conn, "/data/plugins") })
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"ZEROCLAW_DATA_DIR": data, "ZEROCLAW_CONFIG_DIR": "", "ZEROCLAW_SOCKET": sock,
		"CLAWMESH_LISTEN": "0.0.0.0:50051", "ZEROCLAW_TOKEN": "", "HOME": data}
	for _, k := range append(peerAddrEnvs, "DATABASE_URL", "NATS_URL", "CLAWMESH_NATS_SEED", "CLAWMESH_NATS_SEED_FILE") {
		env[k] = ""
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	return sock
}

// doctor in the example client container judged clawmesh up's needs
// there: it failed for want of PostgreSQL's binaries (none in the
// image, and none a client uses), and noted the data directory's secret
// key and seven bus seeds, which a client has none of. It says now that
// it runs as a client, and checks the socket, initialize's answer and
// the stack's health.
func TestDoctorInTheClientContainer(t *testing.T) {
	sock := clientLayout(t)
	var out strings.Builder
	if err := doctorCmd(nil, &out); err != nil {
		t.Fatalf("doctor in a healthy client container: %v\n%s", err, out.String())
	}
	for _, want := range []string{"note  client             run as a client of ZEROCLAW_SOCKET=" + sock,
		"ok    socket             " + sock + " answers", "ok    protocol           initialize answered: protocol 1",
		"ok    gateway            serving", "ok    plugins            1 of 1 loaded from /data/plugins (the stack's folder"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor does not say %q:\n%s", want, out.String())
		}
	}
	for _, not := range []string{"postgres", "data directory", "disk space", "secret key", "bus credential", "stale clusters"} {
		if checked(out.String(), not) {
			t.Errorf("doctor judges clawmesh up's %s in a client:\n%s", not, out.String())
		}
	}
}

// checked says whether doctor's output has a line of the check named.
func checked(out, check string) bool {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && (f[0] == "ok" || f[0] == "note" || f[0] == "FAIL") &&
			strings.HasPrefix(strings.Join(f[1:], " "), check+" ") {
			return true
		}
	}
	return false
}

// fixes is every fix doctor's output names.
func fixes(out string) string {
	var b strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if _, fix, ok := strings.Cut(line, "fix: "); ok {
			b.WriteString(fix + "\n")
		}
	}
	return b.String()
}

// Without $HOME (a container whose uid the image does not know) doctor
// failed before any check: "home directory: $HOME is not defined".
func TestDoctorAsAClientWithoutHome(t *testing.T) {
	clientLayout(t)
	t.Setenv("ZEROCLAW_DATA_DIR", "")
	os.Unsetenv("HOME")
	var out strings.Builder
	if err := doctorCmd(nil, &out); err != nil || !strings.Contains(out.String(), "note  client") {
		t.Fatalf("doctor as a client without $HOME: %v\n%s", err, out.String())
	}
}

// What a client lacks still fails, naming the gateway, not clawmesh up;
// and what makes it no client (a data directory a stack ran on, the
// stack's own settings, --config-dir) gives clawmesh up's checks back.
func TestDoctorAsAClientStillFails(t *testing.T) {
	t.Run("no gateway", func(t *testing.T) {
		sock := clientLayout(t)
		if err := os.Remove(sock); err != nil {
			t.Fatal(err)
		}
		// The client image has no PostgreSQL: with its binaries, and
		// nothing answering, this could be a host where clawmesh up
		// was never run (TestDoctorWithASocketNoStackAnswers, e2e).
		found := postgresBinaries
		postgresBinaries = func() (string, error) { return "", pgcluster.ErrNoBinaries }
		t.Cleanup(func() { postgresBinaries = found })
		var out strings.Builder
		if err := doctorCmd(nil, &out); err == nil || !strings.Contains(out.String(), "FAIL  socket") ||
			strings.Contains(fixes(out.String()), "clawmesh up") || !strings.Contains(fixes(out.String()), "start the gateway that serves it") {
			t.Fatalf("doctor as a client with no gateway: %v\n%s", err, out.String())
		}
	})
	t.Run("initialize refused", func(t *testing.T) {
		sock := fakeSocket(t, serveRefusal)
		clientLayout(t)
		t.Setenv("ZEROCLAW_SOCKET", sock)
		var out strings.Builder
		if err := doctorCmd(nil, &out); err == nil || !strings.Contains(out.String(), "ok    socket             "+sock+" accepts connections") ||
			!strings.Contains(out.String(), "FAIL  protocol           initialize: ") {
			t.Fatalf("doctor as a client refused at initialize: %v\n%s", err, out.String())
		}
	})
	for name, unclient := range map[string]func(data string){
		"a stack ran on the data directory": func(data string) { writeTestFile(t, filepath.Join(data, "clawmesh.lock"), nil) },
		"DATABASE_URL":                      func(string) { t.Setenv("DATABASE_URL", "postgres:///none") },
		"CLAWMESH_NATS_SEED_FILE":           func(string) { t.Setenv("CLAWMESH_NATS_SEED_FILE", "/run/secrets/bus/gateway.nk") },
	} {
		t.Run(name, func(t *testing.T) {
			clientLayout(t)
			unclient(os.Getenv("ZEROCLAW_DATA_DIR"))
			var out strings.Builder
			_ = doctorCmd(nil, &out)
			if strings.Contains(out.String(), "note  client") || !checked(out.String(), "data directory") {
				t.Fatalf("doctor with %s:\n%s", name, out.String())
			}
		})
	}
}

// serveRefusal answers every initialize with an error, as a gateway does
// a token it does not know.
func serveRefusal(conn net.Conn) {
	defer conn.Close()
	buf := make([]byte, 4096)
	if _, err := conn.Read(buf); err != nil {
		return
	}
	_, _ = conn.Write([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"Unauthorized"}}` + "\n"))
}
