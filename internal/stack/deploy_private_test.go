//go:build unix

package stack_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/trust"
)

// podFolderMode is the mode a folder at dir has in container c of spec,
// as Kubernetes and the image lay it out: the kubelet makes an emptyDir
// 0777 (and root's; fsGroup adds setgid, never takes bits away), a
// volume claim is its fsGroup's (group-writable), the container runtime
// mounts /dev/shm 1777, and deploy/Dockerfile makes /data 0700 and the
// process's own. made is true for a folder nothing mounts or ships,
// which the process makes itself (0700) where it may write.
func podFolderMode(spec *corev1.PodSpec, c corev1.Container, dir string) (mode fs.FileMode, writable, made bool) {
	vol, m := mountOf(spec, c, dir)
	switch {
	case m != nil && m.MountPath == dir:
		switch {
		case vol != nil && vol.EmptyDir != nil:
			return 0o777, !m.ReadOnly, false
		case vol != nil && vol.PersistentVolumeClaim != nil:
			return 0o775 | fs.ModeSetgid, !m.ReadOnly && !vol.PersistentVolumeClaim.ReadOnly, false
		}
		return 0o755, false, false
	case m != nil:
		return 0o700, !m.ReadOnly, true
	case dir == "/dev/shm":
		return 0o777 | fs.ModeSticky, true, false
	case strings.HasPrefix(dir, "/dev/shm/"):
		return 0o700, true, true
	case dir == "/data":
		return 0o700, false, false
	}
	return 0o755, false, false
}

// layPod makes under root the folders above path (path's own folder
// included unless the process makes it) with the modes the pod gives
// them, and says whether the process may write path's folder.
func layPod(t *testing.T, root string, spec *corev1.PodSpec, c corev1.Container, path string, includeSelf bool) bool {
	t.Helper()
	var dirs []string
	last := filepath.Dir(path)
	if includeSelf {
		last = path
	}
	for d := last; d != "/"; d = filepath.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	writable := false
	for i, d := range dirs {
		mode, w, made := podFolderMode(spec, c, d)
		writable = w
		if made && i == len(dirs)-1 && !includeSelf {
			break // the process makes it, as it checks it
		}
		at := filepath.Join(root, d)
		if err := os.Mkdir(at, 0o700); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
		if err := os.Chmod(at, mode); err != nil {
			t.Fatal(err)
		}
	}
	return writable
}

// The paths a process refuses unless they are private pass its own
// checks in the pod the manifests give it. The durable bridge's socket
// was /run/clawmesh/durable.sock on an emptyDir, which the kubelet makes
// 0777 and root's: durablesock.CheckSocketPath refused it ("the socket
// folder /run/clawmesh belongs to another user") and the bridge never
// started. The sandbox's plugins folder was a claim mounted on the
// emptyDir /data: trust.CheckPluginsDir refused every plugin ("/data is
// writable by others (mode 0777)"). Each is checked here by the real
// check on a tree laid out with the pod's modes.
func TestPrivatePathsPassTheirChecksInPods(t *testing.T) {
	_, objs, _ := readManifests(t)
	checked := map[string]bool{}
	for where, spec := range podSpecs(objs) {
		for _, c := range spec.Containers {
			if len(c.Command) == 0 {
				continue
			}
			env := envOf(c)
			data := env["ZEROCLAW_DATA_DIR"]
			if data == "" {
				data = "/data"
			}
			root, err := os.MkdirTemp("", "pod")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(root)
			switch c.Command[0] {
			case "durable-bridge":
				sock := env[durablesock.EnvSocket]
				if sock == "" {
					sock = durablesock.DefaultSocket(data)
				}
				if !layPod(t, root, spec, c, sock, false) {
					t.Errorf("%s/%s: the durable socket %s is on no folder the process may write", where, c.Name, sock)
				}
				if err := durablesock.CheckSocketPath(filepath.Join(root, sock)); err != nil {
					t.Errorf("%s/%s: the bridge refuses its socket in the pod: %v", where, c.Name, strings.ReplaceAll(err.Error(), root, ""))
				}
				checked[c.Command[0]] = true
			case "plugin-sandbox":
				plugins := filepath.Join(data, "plugins")
				if _, m := mountOf(spec, c, data); m == nil {
					// The image's /data is its UID's alone (0700): the
					// pod must run as that uid to reach the plugins.
					if sc := spec.SecurityContext; sc == nil || sc.RunAsUser == nil || strconv.FormatInt(*sc.RunAsUser, 10) != imageUID(t) {
						t.Errorf("%s/%s: %s is the image's, its uid %s's alone, and the pod runs as another", where, c.Name, data, imageUID(t))
					}
				}
				layPod(t, root, spec, c, plugins, true)
				if err := trust.CheckPluginsDir(filepath.Join(root, plugins)); err != nil {
					t.Errorf("%s/%s: the sandbox refuses its plugins folder in the pod: %v", where, c.Name, strings.ReplaceAll(err.Error(), root, ""))
				}
				checked[c.Command[0]] = true
			}
		}
	}
	for _, name := range []string{"durable-bridge", "plugin-sandbox"} {
		if !checked[name] {
			t.Errorf("no manifest runs %s", name)
		}
	}
}

// imageUID is the uid deploy/Dockerfile gives /data by default.
func imageUID(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ARG UID=(\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/Dockerfile: no ARG UID=N")
	}
	return string(m[1])
}

// The pod where the plugin commands run (the one that mounts the
// plugins claim writable: `kubectl exec deploy/gateway -- clawmesh
// plugin remove NAME --purge`, deploy/README.md) mounts the memory
// journals the sandbox keeps, at the same path: --purge deletes them in
// the stack's data directory's memories folder. The gateway's pod had
// none there, so --purge said "no memory journal of NAME" and exited 0
// while the journal stayed on the sandbox's claim.
func TestPluginCommandsReachTheSandboxMemories(t *testing.T) {
	_, objs, _ := readManifests(t)
	var memories, plugins string // the sandbox's claims
	for _, spec := range podSpecs(objs) {
		for _, c := range spec.Containers {
			if len(c.Command) == 0 || c.Command[0] != "plugin-sandbox" {
				continue
			}
			data := envOf(c)["ZEROCLAW_DATA_DIR"]
			if v, m := mountOf(spec, c, datadir.Memories(data)); v != nil && v.PersistentVolumeClaim != nil && m.MountPath == datadir.Memories(data) {
				memories = v.PersistentVolumeClaim.ClaimName
			}
			if v, _ := mountOf(spec, c, filepath.Join(data, "plugins")); v != nil && v.PersistentVolumeClaim != nil {
				plugins = v.PersistentVolumeClaim.ClaimName
			}
		}
	}
	if memories == "" || plugins == "" {
		t.Fatalf("the sandbox's memories claim %q, plugins claim %q", memories, plugins)
	}
	installers := 0
	for where, spec := range podSpecs(objs) {
		for _, c := range spec.Containers {
			data := envOf(c)["ZEROCLAW_DATA_DIR"]
			if len(c.Command) == 0 || c.Command[0] == "plugin-sandbox" || data == "" {
				continue
			}
			v, m := mountOf(spec, c, filepath.Join(data, "plugins"))
			if v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != plugins || m.ReadOnly {
				continue
			}
			installers++
			mem := datadir.Memories(data)
			if v, m := mountOf(spec, c, mem); v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != memories || m.MountPath != mem || m.ReadOnly {
				t.Errorf("%s/%s: installs plugins, but %s is not the sandbox's claim %s: plugin remove --purge would leave the journals", where, c.Name, mem, memories)
			}
		}
	}
	if installers == 0 {
		t.Error("no pod mounts the plugins claim writable for the plugin commands")
	}
}
