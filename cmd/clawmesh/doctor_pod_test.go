package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// podLayout builds the gateway pod of deploy/k8s/gateway.yaml: /data an
// emptyDir (0777), the plugins volume mounted below it, the socket on
// the run volume, the role's seed on a Secret volume (0440), and the
// pod's environment (external NATS, the services on TCP, no
// DATABASE_URL). It returns the data directory and the seed's path.
func podLayout(t *testing.T) (data, seed string) {
	t.Helper()
	root := t.TempDir()
	data = filepath.Join(root, "data")
	plugins := filepath.Join(data, "plugins")
	for _, dir := range []string{data, filepath.Join(plugins, "echo"), filepath.Join(root, "secrets")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(data, 0o777); err != nil { // the kubelet's emptyDir
		t.Fatal(err)
	}
	if err := os.Chmod(plugins, 0o2775); err != nil { // a volume under fsGroup
		t.Fatal(err)
	}
	seed = filepath.Join(root, "secrets", "gateway.nk")
	writeTestFile(t, seed, []byte("SUAseed\n"))
	if err := os.Chmod(seed, 0o440); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"ZEROCLAW_DATA_DIR": data, "ZEROCLAW_CONFIG_DIR": "", "DATABASE_URL": "",
		"NATS_URL": "nats://nats:4222", "CLAWMESH_NATS_SEED_FILE": seed, "CLAWMESH_NATS_SEED": "",
		"CLAWMESH_CONFIG_ADDR": "config:50051", "CLAWMESH_SESSION_ADDR": "session:50051",
		"CLAWMESH_UPLOAD_ADDR": "upload-staging:50051", "CLAWMESH_PLUGIN_ADDR": "dns:///plugin-sandbox:50051",
		"CLAWMESH_DURABLE_ADDR": "durable-bridge:50051",
	} {
		t.Setenv(k, v)
	}
	// The gateway on the run volume, its sandbox loading from plugins.
	sock := fakeSocket(t, func(conn net.Conn) { servePlugins(conn, plugins) })
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ZEROCLAW_SOCKET", sock)
	return data, seed
}

// servePlugins is a gateway whose every process serves and whose sandbox
// loaded the one plugin in dir.
func servePlugins(conn net.Conn, dir string) {
	defer conn.Close()
	dec := json.NewDecoder(conn)
	for {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if dec.Decode(&req) != nil {
			return
		}
		var result any = map[string]any{"protocol_version": 1}
		switch req.Method {
		case "health":
			result = map[string]any{"components": map[string]any{"gateway": map[string]any{"status": "serving"}}}
		case "status":
			result = map[string]any{"server_version": "x"}
		case "plugins/list":
			result = map[string]any{"enabled": true, "plugins_dir": dir,
				"plugins": []any{map[string]any{"name": "echo", "dir": "echo", "status": "loaded"}}}
		}
		raw, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
		if _, err := conn.Write(append(raw, '\n')); err != nil {
			return
		}
	}
}

// doctor run in the gateway's pod judges that deployment: it failed the
// emptyDir's mode, the plugins folder below it (which the sandbox sees
// below its own 0700 /data, and loads from), and, with no PostgreSQL
// binaries in the image, the database the pod does not run; and it
// checked seven launcher seeds the pod has none of, not the one it uses.
func TestDoctorInTheGatewaysPod(t *testing.T) {
	_, seed := podLayout(t)
	var out strings.Builder
	if err := doctorCmd(nil, &out); err != nil {
		t.Fatalf("doctor in a healthy gateway pod: %v\n%s", err, out.String())
	}
	for _, want := range []string{"note  postgres", "note  data directory", "ok    bus credential     " + seed, "note  plugins", "ok    plugins            1 of 1 loaded"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor does not say %q:\n%s", want, out.String())
		}
	}
	if strings.Count(out.String(), "bus credential") != 1 {
		t.Errorf("doctor checks seeds the pod does not use:\n%s", out.String())
	}
}

// What is wrong in that pod still fails: a seed others may read, a
// missing one, a plugins folder others may write, a data directory the
// process cannot write.
func TestDoctorInTheGatewaysPodStillFails(t *testing.T) {
	for name, spoil := range map[string]func(data, seed string) error{
		"seed readable by others": func(_, seed string) error { return os.Chmod(seed, 0o444) },
		"seed missing":            func(_, seed string) error { return os.Remove(seed) },
		"plugins writable":        func(data, _ string) error { return os.Chmod(filepath.Join(data, "plugins"), 0o777) },
		"no gateway":              func(_, _ string) error { return os.Remove(os.Getenv("ZEROCLAW_SOCKET")) },
		"data not a folder": func(data, _ string) error {
			if err := os.RemoveAll(data); err != nil {
				return err
			}
			return os.WriteFile(data, nil, 0o600)
		},
	} {
		t.Run(name, func(t *testing.T) {
			data, seed := podLayout(t)
			if err := spoil(data, seed); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			if err := doctorCmd(nil, &out); err == nil || strings.Contains(out.String(), "clawmesh up") {
				t.Fatalf("doctor passed, or sent the pod's operator to clawmesh up:\n%s", out.String())
			}
		})
	}
}
