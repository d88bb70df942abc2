package stack_test

import (
	"bytes"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/grpcserver"
	"github.com/clawmesh/clawmesh/internal/stack"
)

// binaries are the names of the binaries deploy/Dockerfile builds: it
// builds what `go run ./internal/stack/list` prints, the table's packages.
func binaries(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte("go build")) || !bytes.Contains(raw, []byte("$(go run ./internal/stack/list)")) {
		t.Fatal("deploy/Dockerfile does not build the packages internal/stack/list prints")
	}
	out := map[string]bool{}
	for _, p := range stack.Packages() {
		out[filepath.Base(p)] = true
	}
	return out
}

// composeFile is what the tests read of docker-compose.yml.
type composeFile struct {
	Services map[string]struct {
		Image       string                       `json:"image"`
		Build       *struct{ Dockerfile string } `json:"build"`
		Command     []string                     `json:"command"`
		Environment map[string]string            `json:"environment"`
		Volumes     []string                     `json:"volumes"`
		User        string                       `json:"user"`
		CapDrop     []string                     `json:"cap_drop"`
		CapAdd      []string                     `json:"cap_add"`
		SecurityOpt []string                     `json:"security_opt"`
		ReadOnly    bool                         `json:"read_only"`
		Tmpfs       []string                     `json:"tmpfs"`
		MemLimit    string                       `json:"mem_limit"`
		PidsLimit   int                          `json:"pids_limit"`
		Healthcheck *struct {
			Test    []string `json:"test"`
			Disable bool     `json:"disable"`
		} `json:"healthcheck"`
	} `json:"services"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(moduleRoot(t), "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc composeFile
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return doc
}

// pinned is an image with a version tag: not latest, not a bare name.
var pinned = regexp.MustCompile(`^[a-z0-9./-]+:[0-9][A-Za-z0-9._-]*$`)

// docker-compose.yml runs exactly the processes of the table, each with
// its own binary as the command and its own bus identity, every one with
// a health check; what it runs of our image is a binary the image has;
// the other images are pinned.
func TestComposeRunsTheTable(t *testing.T) {
	bins := binaries(t)
	doc := readCompose(t)
	var running []string
	for name, svc := range doc.Services {
		if svc.Build == nil {
			if !pinned.MatchString(svc.Image) {
				t.Errorf("compose service %s: image %q is not pinned to a version", name, svc.Image)
			}
			continue
		}
		if svc.Build.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("compose service %s builds %s", name, svc.Build.Dockerfile)
		}
		if len(svc.Command) == 0 || !bins[svc.Command[0]] {
			t.Errorf("compose service %s runs %v, not a binary the image builds", name, svc.Command)
			continue
		}
		p, ok := stack.Lookup(name)
		if !ok {
			if svc.Command[0] != stack.CLI.Name {
				t.Errorf("compose service %s runs %s, which the stack table does not name", name, svc.Command[0])
			}
			continue
		}
		if svc.Command[0] != p.Name {
			t.Errorf("compose service %s runs %s, want the %s binary", name, strings.Join(svc.Command, " "), p.Name)
		}
		if seed := svc.Environment["CLAWMESH_NATS_SEED_FILE"]; !strings.HasSuffix(seed, "/"+string(p.Role)+".nk") {
			t.Errorf("compose service %s connects to the bus with %q, want the seed of role %s", name, seed, p.Role)
		}
		if svc.Healthcheck == nil || svc.Healthcheck.Disable || !slices.Contains(svc.Healthcheck.Test, "health") {
			t.Errorf("compose service %s has no gRPC health check", name)
		}
		running = append(running, name)
	}
	for _, p := range stack.Processes {
		if !slices.Contains(running, p.Name) {
			t.Errorf("docker-compose.yml does not run %s", p.Name)
		}
	}
}

// kustomization is what deploy/k8s/kustomization.yaml may hold.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// ourImage is the image name the manifests use for deploy/Dockerfile's
// image; kustomization.yaml maps it to a registry.
const ourImage = "clawmesh"

// manifestTypes are the kinds the manifests may hold, by apiVersion/kind.
var manifestTypes = map[string]func() any{
	"v1/Namespace":                           func() any { return &corev1.Namespace{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"v1/PersistentVolumeClaim":               func() any { return &corev1.PersistentVolumeClaim{} },
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                    func() any { return &appsv1.StatefulSet{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
}

// documents splits a YAML stream on its "---" lines, dropping documents
// that hold only comments.
func documents(raw []byte) [][]byte {
	var out [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		content := false
		for _, line := range strings.Split(doc, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				content = true
				break
			}
		}
		if content {
			out = append(out, []byte(doc))
		}
	}
	return out
}

// manifest is one decoded object and where it came from.
type manifest struct {
	file string
	obj  any
}

// readManifests decodes every manifest under deploy/k8s strictly into
// its k8s.io/api type: a field the type does not have fails.
func readManifests(t *testing.T) (top []string, objs []manifest, kust kustomization) {
	t.Helper()
	dir := filepath.Join(moduleRoot(t), "deploy", "k8s")
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".yml" {
			t.Errorf("%s: not a manifest (want .yaml)", rel)
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if rel == "kustomization.yaml" {
			if err := yaml.UnmarshalStrict(raw, &kust); err != nil {
				t.Errorf("%s: %v", rel, err)
			}
			return nil
		}
		if !strings.Contains(rel, "/") {
			top = append(top, rel)
		}
		for i, doc := range documents(raw) {
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Errorf("%s #%d: %v", rel, i+1, err)
				continue
			}
			newObj, ok := manifestTypes[meta.APIVersion+"/"+meta.Kind]
			if !ok {
				t.Errorf("%s #%d: kind %s/%s is not one the test knows", rel, i+1, meta.APIVersion, meta.Kind)
				continue
			}
			obj := newObj()
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s #%d (%s): %v", rel, i+1, meta.Kind, err)
				continue
			}
			objs = append(objs, manifest{file: rel, obj: obj})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return top, objs, kust
}

// The strict decoding refuses what kubectl would refuse: a field the
// type does not have, and a field given twice.
func TestManifestDecodingIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {portz: []}\n",
		"duplicate field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
	} {
		if err := yaml.UnmarshalStrict([]byte(doc), &corev1.Service{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Every manifest under deploy/k8s decodes strictly into the Kubernetes
// types; every container runs a binary deploy/Dockerfile builds (or a
// third-party image pinned as in docker-compose.yml); every process of
// the table runs with its own bus identity and gRPC health probes;
// single-writer processes run one replica and the sandbox scales under an
// autoscaler; kustomization.yaml lists every manifest.
func TestManifestsRunTheTable(t *testing.T) {
	bins := binaries(t)
	top, objs, kust := readManifests(t)
	if len(objs) == 0 {
		t.Fatal("no manifests under deploy/k8s")
	}

	// kustomization.yaml applies every top-level manifest.
	sort.Strings(top)
	res := slices.Clone(kust.Resources)
	sort.Strings(res)
	if !slices.Equal(top, res) {
		t.Errorf("kustomization.yaml resources %v, manifests %v", res, top)
	}
	if kust.Kind != "Kustomization" || kust.Namespace == "" || len(kust.Images) != 1 || kust.Images[0].Name != ourImage {
		t.Errorf("kustomization.yaml: %+v", kust)
	}

	thirdParty := map[string]bool{}
	for _, svc := range readCompose(t).Services {
		if svc.Build == nil {
			thirdParty[svc.Image] = true
		}
	}

	deployed := map[string]*appsv1.Deployment{}
	scaled := map[string]bool{}
	services := map[string]bool{}
	for _, m := range objs {
		var spec *corev1.PodSpec
		name := ""
		switch o := m.obj.(type) {
		case *appsv1.Deployment:
			spec, name = &o.Spec.Template.Spec, o.Name
			if !strings.Contains(m.file, "/") {
				deployed[o.Name] = o
			}
		case *appsv1.StatefulSet:
			spec, name = &o.Spec.Template.Spec, o.Name
		case *autoscalingv2.HorizontalPodAutoscaler:
			if o.Spec.ScaleTargetRef.Kind == "Deployment" {
				scaled[o.Spec.ScaleTargetRef.Name] = true
			}
		case *corev1.Service:
			services[o.Name] = true
		}
		if spec == nil {
			continue
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			where := m.file + ": " + name + "/" + c.Name
			if c.Image != ourImage {
				if !thirdParty[c.Image] {
					t.Errorf("%s: image %q is neither %s nor an image docker-compose.yml pins", where, c.Image, ourImage)
				}
				continue
			}
			if len(c.Command) == 0 || !bins[c.Command[0]] {
				t.Errorf("%s: command %v is not a binary deploy/Dockerfile builds", where, c.Command)
				continue
			}
			for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
				if probe != nil && probe.Exec != nil && (len(probe.Exec.Command) == 0 || !bins[probe.Exec.Command[0]]) {
					t.Errorf("%s: probe runs %v, not a binary deploy/Dockerfile builds", where, probe.Exec.Command)
				}
			}
			p, ok := stack.Lookup(c.Command[0])
			if !ok {
				continue // the CLI (a client)
			}
			checkProcessContainer(t, where, p, c, spec)
		}
	}

	for _, p := range stack.Processes {
		d, ok := deployed[p.Name]
		if !ok {
			t.Errorf("no Deployment %s runs the %s process", p.Name, p.Name)
			continue
		}
		runs := false
		for _, c := range d.Spec.Template.Spec.Containers {
			runs = runs || (len(c.Command) > 0 && c.Command[0] == p.Name)
		}
		if !runs {
			t.Errorf("Deployment %s does not run the %s binary", p.Name, p.Name)
		}
		switch {
		case p.Scalable:
			if !scaled[p.Name] {
				t.Errorf("%s scales, but no HorizontalPodAutoscaler targets its Deployment", p.Name)
			}
		case d.Spec.Replicas == nil || *d.Spec.Replicas != 1:
			t.Errorf("%s runs one replica (single writer or one socket), Deployment says %v", p.Name, d.Spec.Replicas)
		}
		if !p.Scalable && !p.Edge && d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("%s: an update must replace the replica, never run two (strategy %q)", p.Name, d.Spec.Strategy.Type)
		}
		if !p.Edge && !services[p.Name] {
			t.Errorf("no Service %s for the %s process", p.Name, p.Name)
		}
	}
}

// checkProcessContainer checks a container that runs process p: its bus
// identity, and readiness and liveness on the gRPC health of its port.
func checkProcessContainer(t *testing.T, where string, p stack.Process, c corev1.Container, spec *corev1.PodSpec) {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	seed := env["CLAWMESH_NATS_SEED_FILE"]
	if !strings.HasSuffix(seed, "/"+string(p.Role)+".nk") {
		t.Errorf("%s: CLAWMESH_NATS_SEED_FILE %q is not the seed of role %s", where, seed, p.Role)
	}
	mounted := false
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if it.Key == string(p.Role)+".nk" && strings.HasSuffix(seed, "/"+it.Path) {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("%s: no Secret item mounts the seed of role %s", where, p.Role)
	}
	_, port, _ := strings.Cut(env["CLAWMESH_LISTEN"], ":")
	for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if probe == nil || probe.GRPC == nil || port == "" || port != strconv.Itoa(int(probe.GRPC.Port)) {
			t.Errorf("%s: %s probe is not gRPC health on the CLAWMESH_LISTEN port %q", where, name, port)
		}
	}
	// Readiness asks the whole process (NOT_SERVING while its database
	// or the bus is away: no calls then); liveness only whether it runs
	// (grpcserver.Liveness), since a restart mends no outage of either.
	service := func(p *corev1.Probe) string {
		if p == nil || p.GRPC == nil || p.GRPC.Service == nil {
			return ""
		}
		return *p.GRPC.Service
	}
	if s := service(c.ReadinessProbe); s != "" {
		t.Errorf("%s: readiness asks the health of %q, not of the whole process", where, s)
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		if probe != nil && probe.GRPC != nil && service(probe) != grpcserver.Liveness {
			t.Errorf("%s: %s probe asks the health of %q, want %q (a restart mends no outage of the database or the bus)", where, name, service(probe), grpcserver.Liveness)
		}
	}
}

// Kubernetes and compose run the same third-party versions.
func TestManifestsPinWhatComposePins(t *testing.T) {
	_, objs, _ := readManifests(t)
	used := map[string]bool{}
	for _, m := range objs {
		if s, ok := m.obj.(*appsv1.StatefulSet); ok {
			for _, c := range s.Spec.Template.Spec.Containers {
				used[c.Image] = true
			}
		}
	}
	for name, svc := range readCompose(t).Services {
		if svc.Build == nil && !used[svc.Image] {
			t.Errorf("compose runs %s as %s; no StatefulSet under deploy/k8s runs that image", name, svc.Image)
		}
	}
}

// mountOf returns the volume of spec that holds path in container c (the
// mount with the longest path that contains it) and the mount; nil when
// the path is on the container's own file system.
func mountOf(spec *corev1.PodSpec, c corev1.Container, path string) (*corev1.Volume, *corev1.VolumeMount) {
	var best *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if (path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) &&
			(best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	if best == nil {
		return nil, nil
	}
	for i, v := range spec.Volumes {
		if v.Name == best.Name {
			return &spec.Volumes[i], best
		}
	}
	return nil, best
}

// envOf is a container's environment by name (values given inline).
func envOf(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// A process that scales keeps what its replicas share (the memory
// plugins' journals, datadir.Memories) on a volume every replica mounts
// read-write and that outlives a pod: on an emptyDir each replica had a
// journal of its own, a memory stored through one was missing from the
// next, and a pod's restart lost every entry the journal is there to
// keep. No volume of its pod may be ReadWriteOnce, which pods on two
// nodes cannot both mount.
func TestScalableReplicasShareTheirState(t *testing.T) {
	_, objs, _ := readManifests(t)
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, m := range objs {
		if pvc, ok := m.obj.(*corev1.PersistentVolumeClaim); ok {
			claims[pvc.Name] = pvc
		}
	}
	checked := 0
	for _, m := range objs {
		d, ok := m.obj.(*appsv1.Deployment)
		if !ok || strings.Contains(m.file, "/") {
			continue
		}
		p, ok := stack.Lookup(d.Name)
		if !ok || !p.Scalable {
			continue
		}
		spec := &d.Spec.Template.Spec
		for _, v := range spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			pvc := claims[v.PersistentVolumeClaim.ClaimName]
			if pvc == nil {
				t.Errorf("%s: volume %s claims %s, which no manifest makes", d.Name, v.Name, v.PersistentVolumeClaim.ClaimName)
			} else if !slices.Contains(pvc.Spec.AccessModes, corev1.ReadWriteMany) {
				t.Errorf("%s scales, but its volume %s is %v: replicas on two nodes cannot share it", d.Name, v.Name, pvc.Spec.AccessModes)
			}
		}
		for _, c := range spec.Containers {
			if len(c.Command) == 0 || c.Command[0] != p.Name {
				continue
			}
			checked++
			dir := envOf(c)["ZEROCLAW_DATA_DIR"]
			if dir == "" {
				t.Errorf("%s: no ZEROCLAW_DATA_DIR", d.Name)
				continue
			}
			shared := datadir.Memories(dir)
			v, mnt := mountOf(spec, c, shared)
			switch {
			case v == nil || v.PersistentVolumeClaim == nil:
				where := "the container's own file system"
				if v != nil {
					where = "volume " + v.Name
				}
				t.Errorf("%s: %s is on %s, not on a volume claim the replicas share", d.Name, shared, where)
			case mnt.ReadOnly || v.PersistentVolumeClaim.ReadOnly:
				t.Errorf("%s: %s is mounted read-only; the replicas write it", d.Name, shared)
			}
		}
	}
	if checked == 0 {
		t.Error("no Deployment runs a process that scales")
	}
}

// podSpecs are the pod templates of the manifests, by "file: name".
func podSpecs(objs []manifest) map[string]*corev1.PodSpec {
	out := map[string]*corev1.PodSpec{}
	for _, m := range objs {
		switch o := m.obj.(type) {
		case *appsv1.Deployment:
			out[m.file+": "+o.Name] = &o.Spec.Template.Spec
		case *appsv1.StatefulSet:
			out[m.file+": "+o.Name] = &o.Spec.Template.Spec
		}
	}
	return out
}

// sizeUnit is a suffix of a size and the bytes it stands for.
type sizeUnit struct {
	suffix string
	n      int64
}

// parseSize reads a positive number of bytes with at most one of units
// as its suffix (tried in order: the longer suffixes first).
func parseSize(s string, units []sizeUnit) (int64, bool) {
	unit := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, unit = strings.TrimSuffix(s, u.suffix), u.n
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * unit, err == nil && n > 0
}

// goMemLimit parses a GOMEMLIMIT value: bytes, or a number with B, KiB,
// MiB, GiB or TiB (what the Go runtime accepts).
func goMemLimit(s string) (int64, bool) {
	return parseSize(s, []sizeUnit{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}})
}

// Every container has a memory limit, and every Go program (ours, NATS)
// a GOMEMLIMIT below it: the Go runtime does not read the cgroup's limit,
// so without one its heap grows to twice the live data before a
// collection and the kernel kills the pod first, with every call and
// turn it was running. upload-staging's heap holds its staged bytes
// (uploads.max_staged_bytes); a sandbox holds its instances' linear
// memory (plugins.limits.max_total_memory_mb) outside the Go heap, in
// memory it maps itself, so its soft limit is on what the limit leaves
// beside that.
func TestManifestsLimitMemory(t *testing.T) {
	_, objs, _ := readManifests(t)
	heap := map[string]int64{}    // what a process's Go heap must hold
	outside := map[string]int64{} // what it holds beside its Go heap
	for _, p := range configschema.Properties {
		n, _ := p.Default.(int)
		switch p.Path {
		case "uploads.max_staged_bytes":
			heap["upload-staging"] = int64(n)
		case "plugins.limits.max_total_memory_mb":
			outside["plugin-sandbox"] = int64(n) << 20
		}
	}
	if len(heap) != 1 || len(outside) != 1 {
		t.Fatalf("configschema: the bounds of upload-staging and plugin-sandbox not found (%v, %v)", heap, outside)
	}
	for where, spec := range podSpecs(objs) {
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			at := where + "/" + c.Name
			limit, ok := c.Resources.Limits[corev1.ResourceMemory]
			if !ok {
				t.Errorf("%s: no memory limit", at)
				continue
			}
			if req, ok := c.Resources.Requests[corev1.ResourceMemory]; ok && req.Cmp(limit) > 0 {
				t.Errorf("%s: requests %s of memory, more than its limit %s", at, req.String(), limit.String())
			}
			if c.Image != ourImage && !strings.HasPrefix(c.Image, "nats:") {
				continue
			}
			var name string
			if len(c.Command) > 0 {
				name = c.Command[0]
			}
			room := limit.Value() - outside[name]
			raw := envOf(c)["GOMEMLIMIT"]
			soft, ok := goMemLimit(raw)
			switch {
			case room <= 0:
				t.Errorf("%s: the memory limit %s does not hold the %d bytes its settings let it map", at, limit.String(), outside[name])
			case !ok:
				t.Errorf("%s: GOMEMLIMIT %q: want a soft limit under the memory limit %s", at, raw, limit.String())
			case soft > room*9/10 || soft < room*7/10:
				t.Errorf("%s: GOMEMLIMIT %s is not 70 to 90%% of the %d bytes the memory limit %s leaves its heap", at, raw, room, limit.String())
			case soft <= heap[name]:
				t.Errorf("%s: GOMEMLIMIT %s does not hold the %d bytes its settings let it keep", at, raw, heap[name])
			}
		}
	}
}

// dials is whom each process calls over gRPC (the grpcclient.Dial calls
// of its main and Register), which the NetworkPolicies must admit and
// nothing more.
var dials = map[string][]string{
	"config":         nil,
	"session":        {"config", "plugin-sandbox"},
	"upload-staging": {"config", "session"},
	"plugin-sandbox": {"config", "session"},
	"durable-bridge": {"config", "session"},
	"gateway":        {"config", "session", "upload-staging", "plugin-sandbox", "durable-bridge"},
}

// collieListener is the durable bridge's port for Collie from outside the
// cluster (durable.listen_url), by its name in the pod and the Service.
const collieListener = "https"

// channelListener is the plugin sandbox's port for the channel listeners
// (channels.plugin.<alias>.listen, docs/spec.md §8), by its name in the
// pod and the Service: a door for outsiders by design.
const channelListener = "channel"

// selects reports whether a label selector matches labels (matchLabels
// and the four operators of matchExpressions).
func selects(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil {
		return false
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range sel.MatchExpressions {
		v, has := labels[e.Key]
		switch e.Operator {
		case metav1.LabelSelectorOpIn:
			if !has || !slices.Contains(e.Values, v) {
				return false
			}
		case metav1.LabelSelectorOpNotIn:
			if has && slices.Contains(e.Values, v) {
				return false
			}
		case metav1.LabelSelectorOpExists:
			if !has {
				return false
			}
		case metav1.LabelSelectorOpDoesNotExist:
			if has {
				return false
			}
		}
	}
	return true
}

// pod is a pod template as the policies see it.
type pod struct {
	name    string
	labels  map[string]string
	spec    *corev1.PodSpec
	outside bool // a client outside the namespace (Collie)
}

// admits reports whether the policies let from reach port (a container
// port of to) under NetworkPolicy's rules: a pod no policy selects takes
// everything, else the union of the rules of the policies that select it.
func admits(policies []*networkingv1.NetworkPolicy, from, to pod, port corev1.ContainerPort) bool {
	selected := false
	for _, np := range policies {
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !selects(&np.Spec.PodSelector, to.labels) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				if p.Port == nil || (p.Port.IntVal != 0 && p.Port.IntVal == port.ContainerPort) || (p.Port.StrVal != "" && p.Port.StrVal == port.Name) {
					portOK = true
				}
			}
			peerOK := len(rule.From) == 0
			for _, peer := range rule.From {
				switch {
				case peer.IPBlock != nil:
					peerOK = peerOK || from.outside
				case peer.NamespaceSelector != nil:
					allNS := len(peer.NamespaceSelector.MatchLabels) == 0 && len(peer.NamespaceSelector.MatchExpressions) == 0
					peerOK = peerOK || (allNS && (peer.PodSelector == nil || selects(peer.PodSelector, from.labels)))
				case peer.PodSelector != nil:
					peerOK = peerOK || (!from.outside && selects(peer.PodSelector, from.labels))
				}
			}
			if portOK && peerOK {
				return true
			}
		}
	}
	return !selected
}

// The NetworkPolicies admit exactly the connections the processes make:
// each gRPC port from the processes that dial it (dials), NATS from
// every pod that sets NATS_URL, PostgreSQL from those that set
// DATABASE_URL, and from outside the namespace only Collie's TLS
// listener on the durable bridge, which deploy/README.md says Collie
// reaches from outside the cluster.
func TestNetworkPoliciesAdmitWhatTheStackDials(t *testing.T) {
	_, objs, _ := readManifests(t)
	var policies []*networkingv1.NetworkPolicy
	var pods []pod
	var targets []pod
	collieService := false
	for _, m := range objs {
		var p pod
		switch o := m.obj.(type) {
		case *networkingv1.NetworkPolicy:
			policies = append(policies, o)
			continue
		case *corev1.Service:
			for _, sp := range o.Spec.Ports {
				collieService = collieService || (o.Name == "durable-bridge" && sp.Name == collieListener)
			}
			continue
		case *appsv1.Deployment:
			p = pod{name: m.file + ": " + o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec}
		case *appsv1.StatefulSet:
			p = pod{name: m.file + ": " + o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec}
		default:
			continue
		}
		pods = append(pods, p)
		if !strings.Contains(m.file, "/") {
			targets = append(targets, p)
		}
	}
	if len(policies) == 0 {
		t.Fatal("no NetworkPolicy")
	}
	if !collieService {
		t.Errorf("the durable-bridge Service has no port %q for Collie's TLS listener", collieListener)
	}
	// What runs in a pod: our processes by command, NATS and PostgreSQL
	// by image.
	runs := func(p pod) (procs []string, nats, postgres bool) {
		if p.spec == nil {
			return
		}
		for _, c := range p.spec.Containers {
			switch {
			case c.Image == ourImage && len(c.Command) > 0:
				procs = append(procs, c.Command[0])
			case strings.HasPrefix(c.Image, "nats:"):
				nats = true
			case strings.HasPrefix(c.Image, "postgres:"):
				postgres = true
			}
		}
		return
	}
	sets := func(p pod, name string) bool {
		if p.spec == nil {
			return false
		}
		for _, c := range p.spec.Containers {
			if _, ok := envOf(c)[name]; ok {
				return true
			}
		}
		return false
	}
	outside := pod{name: "a client outside the namespace", labels: map[string]string{}, outside: true}
	collie := false
	for _, to := range targets {
		toProcs, toNATS, toPostgres := runs(to)
		for _, c := range to.spec.Containers {
			for _, port := range c.Ports {
				for _, from := range append(slices.Clone(pods), outside) {
					fromProcs, _, _ := runs(from)
					need := false
					switch {
					case port.Name == collieListener && slices.Contains(toProcs, "durable-bridge"):
						need = true // public by design: TLS and a token
					case port.Name == channelListener && slices.Contains(toProcs, "plugin-sandbox"):
						need = true // public by design: a webhook's door
					case from.outside:
					case toNATS:
						need = sets(from, "NATS_URL")
					case toPostgres:
						need = sets(from, "DATABASE_URL")
					default:
						for _, f := range fromProcs {
							for _, q := range toProcs {
								need = need || slices.Contains(dials[f], q)
							}
						}
					}
					got := admits(policies, from, to, port)
					switch {
					case need && !got:
						t.Errorf("the policies block %s from %s port %s (%d), which it needs", from.name, to.name, port.Name, port.ContainerPort)
					case !need && got:
						t.Errorf("the policies admit %s to %s port %s (%d), which it never dials", from.name, to.name, port.Name, port.ContainerPort)
					}
					collie = collie || (from.outside && need && got)
				}
			}
		}
	}
	if !collie {
		t.Errorf("nothing outside the namespace reaches the durable bridge's %s port", collieListener)
	}
}

// A channel's listener is reachable as deploy/README.md says: the
// sandbox's container names the port, a Service with one address (not
// the headless one: a webhook's sender posts to one name and any replica
// takes the message) forwards to it, the policies admit it from outside
// the namespace (TestNetworkPoliciesAdmitWhatTheStackDials), and the
// README binds channels there. Before, nothing named the port and no
// Service reached it: the channel listener the sandbox runs could not be
// reached at all in Kubernetes.
func TestChannelListenerIsReachable(t *testing.T) {
	_, objs, _ := readManifests(t)
	port := int32(0)
	for where, spec := range podSpecs(objs) {
		for _, c := range spec.Containers {
			if c.Image != ourImage || len(c.Command) == 0 || c.Command[0] != "plugin-sandbox" {
				continue
			}
			for _, p := range c.Ports {
				if p.Name == channelListener {
					port = p.ContainerPort
				}
			}
			if port == 0 {
				t.Errorf("%s: no container port %q for the channel listener", where, channelListener)
			}
		}
	}
	served := false
	for _, m := range objs {
		svc, ok := m.obj.(*corev1.Service)
		if !ok || svc.Spec.ClusterIP == corev1.ClusterIPNone || svc.Spec.Selector["app.kubernetes.io/name"] != "plugin-sandbox" {
			continue
		}
		for _, p := range svc.Spec.Ports {
			served = served || (p.Name == channelListener && p.TargetPort.String() == channelListener)
		}
	}
	if !served {
		t.Errorf("no Service with a cluster address forwards port %q to the plugin sandbox", channelListener)
	}
	readme, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if bind := "channels.plugin.<alias>.listen=0.0.0.0:" + strconv.Itoa(int(port)); port != 0 && !bytes.Contains(readme, []byte(bind)) {
		t.Errorf("deploy/README.md does not bind channels where the Service sends them (%s)", bind)
	}
}

// callsOut are the processes that open connections beyond the cluster:
// the session service to the model providers (services/session/provider)
// and the plugin sandbox for plugins granted http_client
// (services/pluginsandbox/wasmhost/httpout.go). No other process dials
// anything but its peers, NATS, PostgreSQL and DNS.
var callsOut = []string{"session", "plugin-sandbox"}

// destination is where a pod opens a connection to, as an egress policy
// sees it: a pod (labels, its namespace's labels) with its address, or
// an address outside the cluster (labels nil).
type destination struct {
	name     string
	labels   map[string]string
	nsLabels map[string]string
	addr     netip.Addr
}

// ourNamespace is the labels of the namespace the manifests run in.
var ourNamespace = map[string]string{"kubernetes.io/metadata.name": "clawmesh"}

// inBlock reports whether addr is in the ipBlock and none of its excepts.
func inBlock(t *testing.T, b *networkingv1.IPBlock, addr netip.Addr) bool {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		t.Fatalf("ipBlock %q: %v", b.CIDR, err)
	}
	if !cidr.Contains(addr) {
		return false
	}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			t.Fatalf("ipBlock except %q: %v", e, err)
		}
		if ex.Contains(addr) {
			return false
		}
	}
	return true
}

// letsOut reports whether the policies let from open a connection to
// port/proto of to under NetworkPolicy's rules: a pod no Egress policy
// selects opens anything, else the union of the egress rules of the
// policies that select it. An ipBlock may match a pod's address too
// (what a CNI does there is its own): a pod is reached through a pod
// selector, or the block excepts its range.
func letsOut(t *testing.T, policies []*networkingv1.NetworkPolicy, from pod, to destination, port int32, proto corev1.Protocol) bool {
	selected := false
	for _, np := range policies {
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !selects(&np.Spec.PodSelector, from.labels) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Egress {
			portOK := len(rule.Ports) == 0
			for _, p := range rule.Ports {
				pr := corev1.ProtocolTCP
				if p.Protocol != nil {
					pr = *p.Protocol
				}
				switch {
				case pr != proto:
				case p.Port == nil:
					portOK = true
				case p.Port.StrVal != "":
					t.Fatalf("%s: a named egress port (%s) is resolved at the destination: give the number", np.Name, p.Port.StrVal)
				case p.EndPort != nil:
					portOK = portOK || (port >= p.Port.IntVal && port <= *p.EndPort)
				default:
					portOK = portOK || port == p.Port.IntVal
				}
			}
			peerOK := len(rule.To) == 0
			for _, peer := range rule.To {
				switch {
				case peer.IPBlock != nil:
					peerOK = peerOK || inBlock(t, peer.IPBlock, to.addr)
				case to.labels == nil:
				case peer.NamespaceSelector != nil:
					peerOK = peerOK || (selects(peer.NamespaceSelector, to.nsLabels) || (len(peer.NamespaceSelector.MatchLabels) == 0 && len(peer.NamespaceSelector.MatchExpressions) == 0)) &&
						(peer.PodSelector == nil || selects(peer.PodSelector, to.labels))
				case peer.PodSelector != nil:
					peerOK = peerOK || (maps.Equal(to.nsLabels, ourNamespace) && selects(peer.PodSelector, to.labels))
				}
			}
			if portOK && peerOK {
				return true
			}
		}
	}
	return !selected
}

// The egress policies let each pod open exactly the connections its
// process makes: the gRPC ports it dials (dials), NATS from every pod
// that sets NATS_URL, PostgreSQL from those that set DATABASE_URL, the
// cluster's DNS from every process, and addresses beyond the cluster
// from the processes that call out (callsOut) only, never the metadata
// address, link-local, loopback or the private ranges clusters number
// their pods, Services and nodes from. Without egress policies a plugin
// sandbox pod reached 169.254.169.254 and every port of every pod.
func TestNetworkPoliciesLetOutOnlyWhatTheStackDials(t *testing.T) {
	_, objs, _ := readManifests(t)
	var policies []*networkingv1.NetworkPolicy
	var pods []pod
	for _, m := range objs {
		switch o := m.obj.(type) {
		case *networkingv1.NetworkPolicy:
			policies = append(policies, o)
		case *appsv1.Deployment:
			pods = append(pods, pod{name: m.file + ": " + o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec})
		case *appsv1.StatefulSet:
			pods = append(pods, pod{name: m.file + ": " + o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec})
		}
	}
	procsOf := func(p pod) (procs []string) {
		for _, c := range p.spec.Containers {
			if c.Image == ourImage && len(c.Command) > 0 {
				procs = append(procs, c.Command[0])
			}
		}
		return procs
	}
	sets := func(p pod, name string) bool {
		for _, c := range p.spec.Containers {
			if _, ok := envOf(c)[name]; ok {
				return true
			}
		}
		return false
	}
	// The stack's own pods, each at an address of a cluster range.
	var targets []destination
	for i, p := range pods {
		targets = append(targets, destination{name: p.name, labels: p.labels, nsLabels: ourNamespace,
			addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(i + 2)})})
	}
	dns := destination{name: "kube-dns", labels: map[string]string{"k8s-app": "kube-dns"},
		nsLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}, addr: netip.MustParseAddr("10.244.0.10")}
	internet := []destination{
		{name: "a provider (IPv4)", addr: netip.MustParseAddr("203.0.113.10")},
		{name: "a provider (IPv6)", addr: netip.MustParseAddr("2001:db8::10")},
	}
	never := []destination{
		{name: "the metadata address", addr: netip.MustParseAddr("169.254.169.254")},
		{name: "the metadata address (IPv6)", addr: netip.MustParseAddr("fd00:ec2::254")},
		{name: "Alibaba's metadata address", addr: netip.MustParseAddr("100.100.100.200")},
		{name: "the Kubernetes API's Service", addr: netip.MustParseAddr("10.96.0.1")},
		{name: "a node", addr: netip.MustParseAddr("192.168.1.20")},
		{name: "a Service of a 172.16/12 cluster", addr: netip.MustParseAddr("172.20.0.1")},
		{name: "loopback", addr: netip.MustParseAddr("127.0.0.1")},
		{name: "an IPv6 link-local address", addr: netip.MustParseAddr("fe80::1")},
		{name: "an IPv6 pod", addr: netip.MustParseAddr("fd12:3456::7")},
		{name: "a pod of another namespace", labels: map[string]string{"app": "other"},
			nsLabels: map[string]string{"kubernetes.io/metadata.name": "other"}, addr: netip.MustParseAddr("10.244.9.9")},
	}
	for _, from := range pods {
		fromProcs := procsOf(from)
		// Every port of every pod of the stack.
		for _, to := range targets {
			toPod := pods[slices.IndexFunc(pods, func(p pod) bool { return p.name == to.name })]
			toProcs := procsOf(toPod)
			for _, c := range toPod.spec.Containers {
				for _, port := range c.Ports {
					need := false
					switch {
					case strings.HasPrefix(c.Image, "nats:"):
						need = sets(from, "NATS_URL")
					case strings.HasPrefix(c.Image, "postgres:"):
						need = sets(from, "DATABASE_URL")
					case port.Name == "grpc":
						for _, f := range fromProcs {
							for _, q := range toProcs {
								need = need || slices.Contains(dials[f], q)
							}
						}
					}
					got := letsOut(t, policies, from, to, port.ContainerPort, corev1.ProtocolTCP)
					switch {
					case need && !got:
						t.Errorf("the policies keep %s from %s port %s (%d), which it dials", from.name, to.name, port.Name, port.ContainerPort)
					case !need && got:
						t.Errorf("the policies let %s out to %s port %s (%d), which it never dials", from.name, to.name, port.Name, port.ContainerPort)
					}
				}
			}
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
			need, got := len(fromProcs) > 0, letsOut(t, policies, from, dns, 53, proto)
			switch {
			case need && !got:
				t.Errorf("the policies keep %s from the cluster's DNS (%s 53)", from.name, proto)
			case !need && got:
				t.Errorf("the policies let %s out to the cluster's DNS (%s 53), which it never asks", from.name, proto)
			}
		}
		out := slices.ContainsFunc(fromProcs, func(p string) bool { return slices.Contains(callsOut, p) })
		for _, to := range internet {
			got := letsOut(t, policies, from, to, 443, corev1.ProtocolTCP)
			switch {
			case out && !got:
				t.Errorf("the policies keep %s from %s (%s), which it calls", from.name, to.name, netip.AddrPortFrom(to.addr, 443))
			case !out && got:
				t.Errorf("the policies let %s out to %s (%s), which it never calls", from.name, to.name, netip.AddrPortFrom(to.addr, 443))
			}
		}
		for _, to := range never {
			for _, port := range []int32{80, 443, 8080, 50051} {
				if letsOut(t, policies, from, to, port, corev1.ProtocolTCP) {
					t.Errorf("the policies let %s out to %s (%s)", from.name, to.name, netip.AddrPortFrom(to.addr, uint16(port)))
				}
			}
		}
	}
}

// composeMount is one "source:target[:mode]" of a compose service.
type composeMount struct{ source, target string }

func composeMounts(vols []string) []composeMount {
	var out []composeMount
	for _, v := range vols {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 {
			out = append(out, composeMount{parts[0], parts[1]})
		}
	}
	return out
}

// under reports whether path is dir or inside it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// In compose each process reads its own bus seed and no other role's:
// the roles' permissions are what confine a process (docs/design.md, "Why
// the compose network needs the same credentials": a compromised sandbox
// must not publish session updates), and a container that can read
// another role's seed connects as that role. Where the setup service
// writes the seeds comes from its command: every role's under
// --config-dir's bus/ folder, each role's alone under --export-seeds's
// <role>/ folder. With --export-seeds the bus/ folder stays setup's own
// (root's, 0700), which a process running as another user without
// capabilities cannot open.
func TestComposeGivesEachProcessOnlyItsSeed(t *testing.T) {
	doc := readCompose(t)
	setup, ok := doc.Services["setup"]
	if !ok {
		t.Fatal("docker-compose.yml has no setup service")
	}
	flagOf := func(name string) string {
		for _, a := range setup.Command {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	// holds maps a named volume to the roles whose seeds it holds.
	holds := map[string][]bus.Role{}
	all := filepath.Join(flagOf("config-dir"), "bus")
	export := flagOf("export-seeds")
	for _, m := range composeMounts(setup.Volumes) {
		for _, r := range bus.Roles {
			if (export == "" && (under(all, m.target) || under(m.target, all))) ||
				(export != "" && (under(filepath.Join(export, string(r)), m.target) || under(m.target, filepath.Join(export, string(r))))) {
				holds[m.source] = append(holds[m.source], r)
			}
		}
	}
	for name, svc := range doc.Services {
		p, ok := stack.Lookup(name)
		if !ok {
			continue
		}
		if u := svc.User; u == "" || u == "0" || strings.HasPrefix(u, "0:") || strings.HasPrefix(u, "root") || !slices.Contains(svc.CapDrop, "ALL") {
			t.Errorf("compose service %s runs as %q with cap_drop %v: it could open setup's own folders", name, u, svc.CapDrop)
		}
		seed := svc.Environment["CLAWMESH_NATS_SEED_FILE"]
		own := false
		for _, m := range composeMounts(svc.Volumes) {
			var others []bus.Role
			for _, r := range holds[m.source] {
				if r != p.Role {
					others = append(others, r)
				} else if under(seed, m.target) {
					own = true
				}
			}
			if len(others) > 0 {
				t.Errorf("compose service %s mounts volume %s at %s, which holds the seeds of roles %v", name, m.source, m.target, others)
			}
		}
		if !own {
			t.Errorf("compose service %s: its seed %q is on no volume the setup service writes its role's seed to", name, seed)
		}
	}
}

// In compose the config service's key for secrets at rest
// (datadir.SecretKey of its data directory) is on a volume no other
// process mounts: before, it was in the data volume every container
// mounts, so the gateway and the plugin sandbox could read the key that
// opens every stored secret. The setup service, which alone mounts it
// besides, moves a key an earlier run left in the shared data volume
// there (--config-key-dir) and hands the folder to the processes' uid.
func TestComposeGivesTheConfigKeyOnlyToConfig(t *testing.T) {
	doc := readCompose(t)
	cfg, ok := doc.Services["config"]
	if !ok {
		t.Fatal("docker-compose.yml has no config service")
	}
	dataDir := cfg.Environment["ZEROCLAW_DATA_DIR"]
	if dataDir == "" {
		t.Fatal("compose service config: no ZEROCLAW_DATA_DIR")
	}
	// volumeAt is the named volume holding path in a service (the mount
	// with the longest target that contains it), and that target.
	volumeAt := func(vols []string, path string) (source, target string) {
		for _, m := range composeMounts(vols) {
			if under(path, m.target) && len(m.target) > len(target) {
				source, target = m.source, m.target
			}
		}
		return source, target
	}
	keyVol, _ := volumeAt(cfg.Volumes, datadir.SecretKey(dataDir))
	if keyVol == "" {
		t.Fatalf("compose service config: its key %s is on no volume (lost with the container)", datadir.SecretKey(dataDir))
	}
	for name, svc := range doc.Services {
		if name == "config" || name == "setup" {
			continue
		}
		for _, m := range composeMounts(svc.Volumes) {
			if m.source == keyVol {
				t.Errorf("compose service %s mounts volume %s at %s, which holds the config service's key", name, keyVol, m.target)
			}
		}
	}
	setup := doc.Services["setup"]
	var keyDir, sharedDir string
	for _, a := range setup.Command {
		if v, ok := strings.CutPrefix(a, "--config-key-dir="); ok {
			keyDir = v
		}
		if v, ok := strings.CutPrefix(a, "--config-dir="); ok {
			sharedDir = v
		}
	}
	if src, target := volumeAt(setup.Volumes, keyDir); keyDir == "" || src != keyVol || target != keyDir {
		t.Errorf("the setup service does not prepare the config service's volume %s (--config-key-dir=%q, mounted there: %q)", keyVol, keyDir, src)
	}
	if src, _ := volumeAt(setup.Volumes, sharedDir); src == keyVol {
		t.Errorf("the setup service's --config-dir %s is on the config key's volume %s", sharedDir, keyVol)
	}
}

// Every pod runs as deploy/README.md says: non-root, no privilege
// escalation, every capability dropped, a read-only root file system
// with the folders a process writes (its data directory, /tmp, the
// PostgreSQL socket folder) on writable volumes, and no Kubernetes API
// token (nothing of the stack calls the API; mounted by default, the
// default account's token was a credential in every container, the
// plugin sandbox's included).
// writesInData are the folders of its data directory a process writes
// where the data directory itself is the image's, read-only: the plugin
// sandbox's, whose plugins folder must have no folder above it that
// others may write (an emptyDir is 0777), writes only its compilation
// cache and the memory journals.
var writesInData = map[string][]string{"plugin-sandbox": {"wasm-cache", "memories"}}

func TestManifestsRestrictEveryPod(t *testing.T) {
	_, objs, _ := readManifests(t)
	for where, spec := range podSpecs(objs) {
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%s: the service account token is mounted", where)
		}
		if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: not runAsNonRoot", where)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			at := where + "/" + c.Name
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Errorf("%s: no securityContext", at)
				continue
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Errorf("%s: the root file system is writable", at)
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Errorf("%s: privilege escalation allowed", at)
			case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
				t.Errorf("%s: capabilities not all dropped", at)
			}
			var writes []string
			if dir := envOf(c)["ZEROCLAW_DATA_DIR"]; dir != "" {
				writes = append(writes, "/tmp")
				if len(c.Command) > 0 && writesInData[c.Command[0]] != nil {
					for _, sub := range writesInData[c.Command[0]] {
						writes = append(writes, filepath.Join(dir, sub))
					}
				} else {
					writes = append(writes, dir)
				}
			}
			if strings.HasPrefix(c.Image, "postgres:") {
				writes = append(writes, envOf(c)["PGDATA"], "/var/run/postgresql", "/tmp")
			}
			for _, w := range writes {
				// A mount without a volume of the pod is a
				// StatefulSet's claim template.
				if v, m := mountOf(spec, c, w); m == nil || m.ReadOnly || (v != nil && (v.Secret != nil || v.ConfigMap != nil)) {
					t.Errorf("%s: %s is not on a writable volume", at, w)
				}
			}
		}
	}
}

// rootStarts are the compose services that start as root, and the
// capabilities each keeps for what it does as root before it drops to
// its account or ends: setup hands the folders and files it writes to
// CLAWMESH_UID; PostgreSQL's entrypoint hands its volume to its own
// account (CHOWN, FOWNER), reads the password file that belongs to
// CLAWMESH_UID (DAC_OVERRIDE) and drops to its account (SETUID, SETGID).
var rootStarts = map[string][]string{
	"setup":    {"CHOWN", "DAC_OVERRIDE", "FOWNER"},
	"postgres": {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"},
}

// In compose every container runs with a read-only root file system
// (its writes go to volumes; /tmp, and PostgreSQL's socket folder, to a
// tmpfs; NATS writes nothing), every capability dropped but the few a root start needs
// (rootStarts), and no-new-privileges; all but those run as a non-root
// user (NATS, which the official image starts as root, as nobody), as
// the Kubernetes manifests run them. PostgreSQL ran with a writable root
// file system and Docker's default capabilities (NET_RAW, MKNOD,
// SYS_CHROOT, ... kept by its root entrypoint).
func TestComposeRestrictsContainers(t *testing.T) {
	for name, svc := range readCompose(t).Services {
		if !svc.ReadOnly {
			t.Errorf("compose service %s: the root file system is writable", name)
		}
		postgres := strings.HasPrefix(svc.Image, "postgres:")
		if (svc.Build != nil || postgres) && !slices.Contains(svc.Tmpfs, "/tmp") {
			t.Errorf("compose service %s: no tmpfs on /tmp", name)
		}
		if postgres && !slices.Contains(svc.Tmpfs, "/var/run/postgresql") {
			t.Errorf("compose service %s: no tmpfs on /var/run/postgresql, its socket folder", name)
		}
		if !slices.Contains(svc.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("compose service %s: no no-new-privileges (security_opt %v)", name, svc.SecurityOpt)
		}
		if !slices.Contains(svc.CapDrop, "ALL") {
			t.Errorf("compose service %s keeps capabilities (cap_drop %v)", name, svc.CapDrop)
		}
		for _, c := range svc.CapAdd {
			if !slices.Contains(rootStarts[name], c) {
				t.Errorf("compose service %s adds capability %s", name, c)
			}
		}
		_, root := rootStarts[name]
		if u := svc.User; !root && (u == "" || u == "0" || strings.HasPrefix(u, "0:") || strings.HasPrefix(u, "root")) {
			t.Errorf("compose service %s runs as %q: root", name, u)
		}
	}
}

// composeBytes reads a compose size (mem_limit): a number of bytes with
// an optional b, k, m or g suffix (kb, mb, gb too), as Docker reads it.
func composeBytes(s string) (int64, bool) {
	return parseSize(strings.ToLower(s), []sizeUnit{{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1}})
}

// docker-compose.yml bounds every container as the manifests bound its
// pod: the same memory limit and, for a Go process, the same GOMEMLIMIT
// (TestManifestsLimitMemory checks those against the settings), and a
// bound on processes. Without them one container (a sandbox a plugin
// fills, a gateway of clients that do not read) could take the host's
// memory from every other and from the user's own programs.
func TestComposeLimitsMemory(t *testing.T) {
	_, objs, _ := readManifests(t)
	type bound struct {
		limit int64
		soft  string
	}
	manifest := map[string]bound{} // by the process's binary, or image name
	for _, spec := range podSpecs(objs) {
		for _, c := range spec.Containers {
			limit, ok := c.Resources.Limits[corev1.ResourceMemory]
			if !ok {
				continue
			}
			key := strings.SplitN(c.Image, ":", 2)[0]
			if c.Image == ourImage && len(c.Command) > 0 {
				key = c.Command[0]
			}
			manifest[key] = bound{limit.Value(), envOf(c)["GOMEMLIMIT"]}
		}
	}
	for name, svc := range readCompose(t).Services {
		limit, ok := composeBytes(svc.MemLimit)
		if !ok {
			t.Errorf("compose service %s: no memory limit (mem_limit %q)", name, svc.MemLimit)
		}
		if svc.PidsLimit <= 0 {
			t.Errorf("compose service %s: no bound on its processes (pids_limit)", name)
		}
		key := strings.SplitN(svc.Image, ":", 2)[0]
		if svc.Build != nil && len(svc.Command) > 0 {
			key = svc.Command[0]
		}
		want, ok := manifest[key]
		if !ok || svc.Build != nil && key == stack.CLI.Name {
			continue // the one-shot setup: no pod of its own
		}
		if limit != want.limit {
			t.Errorf("compose service %s: mem_limit %s, the manifests limit it to %d bytes", name, svc.MemLimit, want.limit)
		}
		if got := svc.Environment["GOMEMLIMIT"]; got != want.soft {
			t.Errorf("compose service %s: GOMEMLIMIT %q, the manifests give it %q", name, got, want.soft)
		}
	}
}

// deploy/Dockerfile builds with GOTOOLCHAIN=local, so its build image's
// Go must be at least go.mod's: it names that release exactly. A minor
// tag (golang:1.26-bookworm) is whatever release the builder pulled
// last, and a cached one older than go.mod's failed the build at `go mod
// download` ("go.mod requires go >= ...; GOTOOLCHAIN=local").
func TestDockerfileBuildsWithGoModsGo(t *testing.T) {
	root := moduleRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go ([0-9.]+)$`).FindSubmatch(mod)
	arg := regexp.MustCompile(`(?m)^ARG BUILD_IMAGE=golang:([0-9.]+)-`).FindSubmatch(raw)
	if goLine == nil || arg == nil {
		t.Fatalf("go.mod's go line %q, Dockerfile's BUILD_IMAGE %q", goLine, arg)
	}
	if !bytes.Contains(raw, []byte("GOTOOLCHAIN=local")) {
		t.Fatal("deploy/Dockerfile no longer builds with GOTOOLCHAIN=local: revisit this test")
	}
	if string(arg[1]) != string(goLine[1]) {
		t.Errorf("deploy/Dockerfile builds with golang:%s-..., go.mod says go %s", arg[1], goLine[1])
	}
}
