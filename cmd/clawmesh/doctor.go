package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/trust"
	"github.com/clawmesh/clawmesh/internal/rpcclient"
	"github.com/clawmesh/clawmesh/internal/unixsock"
	"github.com/clawmesh/clawmesh/internal/version"
)

const doctorUsage = `usage: clawmesh doctor [--config-dir DIR] [--socket PATH] [--token T] [--fix]

Checks what a stack needs and says what to do about each problem: the
PostgreSQL binaries, the data directory's owner and modes, the free space
on its disk and the database's, its secret key and bus credentials, stale
private clusters (root), the client socket, the health and version of
every process of a running stack, and its plugins (the plugins folder's
owner and modes, each plugin not loaded and why). --fix removes
stale clusters. Exits 1 when a check fails.

In a container of compose or deploy/k8s (CLAWMESH_CONFIG_ADDR or another
CLAWMESH_*_ADDR set) it judges that deployment: the database and the
config key are the services', the bus seed is CLAWMESH_NATS_SEED_FILE's,
the data directory is a volume of the container, and the folders above
the plugins folder are the sandbox's own, in its containers.

Run as a client (a socket named by --socket or ZEROCLAW_SOCKET, no
--config-dir, none of the stack's own settings, and no stack ever run on
the data directory: a client container, or the host of a compose stack)
it says so and checks what a client needs: the socket, initialize's
answer, and the health, version and plugins of the stack behind it.
`

// postgresBinaries finds PostgreSQL's server binaries (a variable: the
// tests take them away, as a client image has none).
var postgresBinaries = pgcluster.Binaries

// doctor collects the results of the checks.
type doctor struct {
	out    io.Writer
	failed int
	// elsewhere names the environment variable that puts the services
	// in other containers ("CLAWMESH_CONFIG_ADDR=config:50051"), as in
	// compose and deploy/k8s, where doctor runs in a gateway's container:
	// the database, the config key and the plugins' parent folders are
	// theirs, not this data directory's. "" under clawmesh up.
	elsewhere string
	// client names the socket doctor runs as a client of
	// ("ZEROCLAW_SOCKET=/run/clawmesh/daemon.sock"; clientOf): the
	// stack, its database and its data directory are elsewhere, and
	// only what a client needs is judged here. "" otherwise.
	client string
	// unanswered names the socket doctor would have run as a client of
	// had it answered ("ZEROCLAW_SOCKET=/run/x.sock"): the checks are
	// clawmesh up's, and the socket's fix says both ways out. "" otherwise.
	unanswered string
}

// peerAddrEnvs are the addresses the processes read to reach the
// services (internal/service); any of them set means a deployment of
// containers, not clawmesh up.
var peerAddrEnvs = []string{"CLAWMESH_CONFIG_ADDR", "CLAWMESH_SESSION_ADDR", "CLAWMESH_UPLOAD_ADDR", "CLAWMESH_PLUGIN_ADDR", "CLAWMESH_DURABLE_ADDR"}

func servicesElsewhere() string {
	for _, env := range peerAddrEnvs {
		if v := os.Getenv(env); v != "" {
			return env + "=" + v
		}
	}
	return ""
}

// stackSettings are what a process of the stack reads, besides the
// service addresses (peerAddrEnvs): a client's environment has none.
var stackSettings = []string{"DATABASE_URL", "NATS_URL", bus.EnvSeed, bus.EnvSeedFile}

// clientOf says whether doctor runs as a client only, and of which
// socket: one named (--socket, ZEROCLAW_SOCKET), with no --config-dir and
// none of the stack's settings, and a data directory no stack ever ran
// on (no lock file) or none at all (no $HOME). The example client
// container (deploy/k8s/examples/client.yaml) is one: the image's
// ZEROCLAW_DATA_DIR names its own empty /data, and the socket is its
// gateway sidecar's. There doctor judged clawmesh up's needs and failed
// for want of PostgreSQL's binaries, which no client uses. A data
// directory a stack ran on is judged as ever, ZEROCLAW_SOCKET or not.
func clientOf(sf *socketFlags) string {
	socket, named := sf.socket, "--socket "
	if socket == "" {
		socket, named = os.Getenv("ZEROCLAW_SOCKET"), "ZEROCLAW_SOCKET="
	}
	if socket == "" || sf.dir != "" {
		return ""
	}
	for _, env := range append(peerAddrEnvs[:len(peerAddrEnvs):len(peerAddrEnvs)], stackSettings...) {
		if os.Getenv(env) != "" {
			return ""
		}
	}
	if dir, err := datadir.Resolve(""); err == nil {
		if _, err := os.Lstat(datadir.LockFile(dir)); !errors.Is(err, fs.ErrNotExist) {
			return ""
		}
	}
	return named + socket
}

func (d *doctor) ok(check, detail string) { fmt.Fprintf(d.out, "ok    %-18s %s\n", check, detail) }

func (d *doctor) note(check, detail string) { fmt.Fprintf(d.out, "note  %-18s %s\n", check, detail) }

func (d *doctor) fail(check, detail, fix string) {
	d.failed++
	fmt.Fprintf(d.out, "FAIL  %-18s %s\n", check, detail)
	if fix != "" {
		fmt.Fprintf(d.out, "      %-18s fix: %s\n", "", fix)
	}
}

// doctorCmd runs `clawmesh doctor`.
func doctorCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	var sf socketFlags
	sf.register(fs)
	fix := fs.Bool("fix", false, "remove stale private PostgreSQL clusters")
	rest, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, doctorUsage, fs)
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("doctor: unexpected argument %q", rest[0])
	}
	// unanswered is the client socket doctor would have judged alone,
	// when nothing answers there (see below); "" otherwise.
	var unanswered string
	if client := clientOf(&sf); client != "" {
		socket := sf.socket
		if socket == "" {
			socket = os.Getenv("ZEROCLAW_SOCKET")
		}
		// --socket names a stack to judge from outside; clawmesh up
		// does not listen there. Nor can a host without PostgreSQL's
		// server binaries run clawmesh up as set (DATABASE_URL would
		// have made this no client): a client container, whose gateway
		// is what to start.
		_, noPostgres := postgresBinaries()
		if sf.socket != "" || noPostgres != nil || unixsock.Serving(socket) {
			d := &doctor{out: out, client: client}
			d.note("client", "run as a client of "+client+": the stack runs elsewhere, and clawmesh up's checks (PostgreSQL, the data directory, its keys) are for where it runs; checked here: the socket, initialize, and the stack's health")
			d.stack(socket, &sf)
			if d.failed > 0 {
				return fmt.Errorf("doctor: %d check(s) failed", d.failed)
			}
			return nil
		}
		// Nothing answers there: the stack may run elsewhere and be
		// down, or this is a host where ZEROCLAW_SOCKET is exported
		// and clawmesh up was never run (it listens on that path
		// too). Judged as a client only, doctor said the stack ran
		// elsewhere and checked nothing of this host; it checks both
		// now and says which is which.
		unanswered = client
	}
	dir, err := datadir.Resolve(sf.dir)
	if err != nil {
		return err
	}
	d := &doctor{out: out, elsewhere: servicesElsewhere(), unanswered: unanswered}
	if unanswered != "" {
		d.note("client", unanswered+" answers no stack, and none ever ran on "+dir+
			": checked what clawmesh up needs on this host (it would listen on that path), and the socket")
	}
	d.binaries()
	state := d.dataDir(dir)
	if state == dirUsable {
		d.diskSpace("disk space", dir)
		if cluster := pgcluster.Dir(dir); cluster != "" && os.Getenv("DATABASE_URL") == "" && d.elsewhere == "" {
			d.diskSpace("database disk", cluster)
		}
		if _, err := os.Lstat(datadir.SecretKey(dir)); d.elsewhere != "" && os.IsNotExist(err) {
			d.note("secret key", "kept by the config service in its own container ("+d.elsewhere+")")
		} else {
			d.privateFile("secret key", datadir.SecretKey(dir), "created by the config service at its first start")
		}
		d.busCredentials(dir)
	}
	d.staleClusters(dir, *fix)
	socket := sf.socket
	if socket == "" {
		socket = datadir.Socket(dir)
	}
	// A socket inside a data directory that is not one (a file) is that
	// one failure again, said already with its fix.
	if state != dirUnusable || !strings.HasPrefix(socket, dir+string(filepath.Separator)) {
		d.stack(socket, &sf)
	}
	if d.failed > 0 {
		return fmt.Errorf("doctor: %d check(s) failed", d.failed)
	}
	return nil
}

func (d *doctor) binaries() {
	if os.Getenv("DATABASE_URL") != "" {
		d.ok("postgres", "DATABASE_URL is set: the stack uses that server")
		return
	}
	if d.elsewhere != "" {
		// No process here runs PostgreSQL or needs its binaries: the
		// services that use the database say below whether they reach it.
		d.note("postgres", "the services run in other containers ("+d.elsewhere+"): the database is theirs, and their health below says whether they reach it")
		return
	}
	bin, err := postgresBinaries()
	if err != nil {
		d.fail("postgres", "no initdb/postgres on PATH or under /usr/lib/postgresql/*/bin",
			"install the PostgreSQL server (Debian: apt-get install postgresql), or set DATABASE_URL")
		return
	}
	d.ok("postgres", "server binaries in "+bin)
}

// dirState is what the data directory check found.
type dirState int

const (
	dirMissing  dirState = iota // not made yet
	dirUnusable                 // not a directory, or not to be read
	dirUsable                   // a directory the other checks look in
)

// dataDir checks the data directory's owner and mode, and says whether
// the checks of what it holds can look in it: a file, or a folder that
// cannot be read, fails once here rather than again for each of them.
func (d *doctor) dataDir(dir string) dirState {
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		d.note("data directory", dir+" does not exist yet: clawmesh up creates it")
		return dirMissing
	}
	if err != nil {
		d.fail("data directory", err.Error(), "")
		return dirUnusable
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if fi.IsDir() && d.elsewhere != "" {
		return d.containerDataDir(dir, fi, st)
	}
	switch {
	case !fi.IsDir():
		d.fail("data directory", dir+" is not a directory", "move it away, or pick another --config-dir")
		return dirUnusable
	case st != nil && int(st.Uid) != os.Geteuid():
		d.fail("data directory", fmt.Sprintf("%s is owned by uid %d, not you (uid %d)", dir, st.Uid, os.Geteuid()),
			fmt.Sprintf("run as its owner, or chown -R %d %s", os.Geteuid(), dir))
	case fi.Mode().Perm()&0o077 != 0:
		d.fail("data directory", fmt.Sprintf("%s is mode %04o: other accounts reach it", dir, fi.Mode().Perm()),
			"chmod 700 "+dir+" (clawmesh up also does it at start)")
	default:
		d.ok("data directory", dir+" (0700, yours)")
	}
	return dirUsable
}

// containerDataDir judges a container's data directory. Its owner and
// mode are the volume's (Kubernetes makes an emptyDir 0777 and root's,
// and the process cannot chmod it), and it holds none of the stack's
// secrets, which the services keep in their own containers: said, not
// failed. That this uid cannot use it is a failure still: clawmesh plugin
// install and the gateway's files go there.
func (d *doctor) containerDataDir(dir string, fi fs.FileInfo, st *syscall.Stat_t) dirState {
	if err := syscall.Access(dir, 0o7); err != nil { // R_OK|W_OK|X_OK
		d.fail("data directory", fmt.Sprintf("%s: uid %d cannot read and write it: %v", dir, os.Geteuid(), err),
			"give the volume to the container's uid (fsGroup in Kubernetes, the setup service in compose)")
		return dirUnusable
	}
	if st != nil && (int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0) {
		d.note("data directory", fmt.Sprintf("%s is uid %d's, mode %04o: a volume of this container (an emptyDir is 0777 and root's); the services keep their secrets in their own containers (%s)",
			dir, st.Uid, fi.Mode().Perm(), d.elsewhere))
		return dirUsable
	}
	d.ok("data directory", dir+" (yours)")
	return dirUsable
}

// busCredentials checks the bus seeds the processes connect with: the
// one CLAWMESH_NATS_SEED_FILE (or CLAWMESH_NATS_SEED) gives this
// container's processes, as compose and deploy/k8s do with an external
// NATS, else every role's in the data directory, which clawmesh up makes.
func (d *doctor) busCredentials(dir string) {
	if os.Getenv(bus.EnvSeed) != "" {
		d.ok("bus credential", bus.EnvSeed+" is set")
		return
	}
	if path := os.Getenv(bus.EnvSeedFile); path != "" {
		d.seedFile(path)
		return
	}
	for _, r := range bus.Roles {
		d.privateFile("bus credential", bus.SeedFile(dir, r), "created by clawmesh up at its start")
	}
}

// seedFile checks the seed a container's processes read: there, not
// made by anyone at start, so a missing or unreadable one is a failure.
// Its group may read it (a Kubernetes Secret mounted 0440 for the
// pod's fsGroup); others may not.
func (d *doctor) seedFile(path string) {
	f, err := os.Open(path)
	if err != nil {
		d.fail("bus credential", bus.EnvSeedFile+": "+err.Error(), "mount the role's seed there (clawmesh bus init writes them)")
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		d.fail("bus credential", err.Error(), "")
	case fi.Mode().Perm()&0o007 != 0:
		d.fail("bus credential", fmt.Sprintf("%s is mode %04o: other accounts read it", path, fi.Mode().Perm()), "chmod o-rwx "+path+" (defaultMode 0440 on a Secret)")
	default:
		d.ok("bus credential", fmt.Sprintf("%s (%04o, readable here)", path, fi.Mode().Perm()))
	}
}

// minFreeBytes is the free space below which the disk of the data
// directory (or of the database) fails the check: one upload at its 10 MB
// limit and the logs' next lines.
const minFreeBytes = 16 << 20

// diskSpace checks that the disk holding path has room, and inodes, left.
// On a full disk the stack keeps serving what needs no writes, health
// included: uploads, plugin memories, logs and (on the database's disk)
// every change fail with "no space left on the disk", and this is where a
// user asking what is wrong learns it.
func (d *doctor) diskSpace(check, path string) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			d.fail(check, err.Error(), "")
		}
		return
	}
	free := int64(st.Bavail) * st.Bsize
	switch {
	case free < minFreeBytes:
		d.fail(check, fmt.Sprintf("%d bytes free on the disk of %s: once it is full, uploads, plugin memories and logs fail there, and so do the database's writes on its disk", free, path),
			"free space on that disk (df -h "+path+")")
	case st.Files > 0 && st.Ffree == 0:
		d.fail(check, "no inodes free on the disk of "+path, "remove files on that disk (df -i "+path+")")
	default:
		d.ok(check, fmt.Sprintf("%d MiB free under %s", free>>20, path))
	}
}

// privateFile checks that a secret file exists and only its owner reads it.
func (d *doctor) privateFile(check, path, origin string) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d.note(check, path+" does not exist yet: "+origin)
	case err != nil:
		d.fail(check, err.Error(), "")
	case fi.Mode().Perm()&0o077 != 0:
		d.fail(check, fmt.Sprintf("%s is mode %04o", path, fi.Mode().Perm()), "chmod 600 "+path)
	default:
		d.ok(check, path+" (0600)")
	}
}

func (d *doctor) staleClusters(dir string, fix bool) {
	if os.Geteuid() != 0 {
		return // an ordinary user's cluster lives in its data directory
	}
	if d.elsewhere != "" {
		// The services, the database among them, run in other
		// containers: no cluster here is this deployment's, and a
		// gateway's pod failed on whatever its host's folder held.
		return
	}
	switch old, cur := pgcluster.EarlierCluster(dir), pgcluster.Dir(dir); {
	case old == "":
	case cur == "":
		d.note("earlier cluster", old+" holds the database of an earlier version; clawmesh up adopts it")
	default:
		d.note("earlier cluster", old+" (an earlier version's, never removed by a start) may hold data; "+dir+" uses "+cur)
	}
	stales := pgcluster.Stales(dir)
	if len(stales) == 0 {
		d.ok("stale clusters", "none under "+pgcluster.RootClusters)
		return
	}
	if fix {
		for _, removed := range pgcluster.Collect(dir, nil) {
			d.ok("stale clusters", "removed "+removed)
		}
	}
	for _, st := range stales {
		if fix && !st.HoldsData {
			continue
		}
		if st.Earlier {
			d.fail("stale clusters", st.Dir+": "+st.Why+"; it holds that directory's database", st.Fix)
			continue
		}
		if st.HoldsData {
			// Never removed by a start nor by --fix: the data directory
			// may have moved, or be on a disk not mounted now.
			d.fail("stale clusters", st.Dir+": "+st.Why+"; it holds a database",
				"start its data directory if it was moved, or remove "+st.Dir+" yourself once nothing in it is needed")
			continue
		}
		d.fail("stale clusters", st.Dir+": "+st.Why, "clawmesh doctor --fix (clawmesh up also removes them at start)")
	}
}

// stack checks the socket and, when a stack answers on it, the health and
// version of every process.
func (d *doctor) stack(socket string, sf *socketFlags) {
	fi, err := os.Lstat(socket)
	// In a container the socket is its gateway's, which clawmesh up
	// does not start.
	start := "clawmesh up (or make up)"
	switch {
	case d.client != "":
		start = "start the gateway that serves it (a sidecar's or a container's: its log says why it is not up), or name another with --socket"
	case d.elsewhere != "":
		start = "start the gateway that serves it (its container's log says why it is not up)"
	case d.unanswered != "":
		start = "clawmesh up to run the stack on this host (it listens there), or, if the stack runs elsewhere, start the gateway that serves " +
			socket + "; unset ZEROCLAW_SOCKET to use the data directory's own socket"
	}
	if errors.Is(err, fs.ErrNotExist) {
		if d.elsewhere != "" || d.client != "" {
			d.fail("socket", socket+" does not exist: no gateway listens there", start)
			return
		}
		d.fail("socket", socket+" does not exist: no stack runs on this data directory", start)
		return
	}
	if err != nil {
		d.fail("socket", err.Error(), "")
		return
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		if d.client != "" {
			d.fail("socket", socket+" is not a socket", "name the gateway's socket with --socket or ZEROCLAW_SOCKET")
			return
		}
		d.fail("socket", socket+" is not a socket", "remove it; clawmesh up creates the socket")
		return
	}
	if fi.Mode().Perm()&0o077 != 0 {
		d.fail("socket", fmt.Sprintf("%s is mode %04o", socket, fi.Mode().Perm()), "restart the stack: it creates the socket 0600")
	}
	sf.socket = socket
	c, err := sf.dial()
	if err != nil {
		switch {
		case d.client != "" && unixsock.Serving(socket):
			// Connected, and initialize failed: the protocol's
			// answer, not the socket, is what the client lacks.
			d.ok("socket", socket+" accepts connections")
			d.fail("protocol", "initialize: "+err.Error(), "a paired user's ZEROCLAW_TOKEN (or --token) must be one the stack issued (clawmesh token create where it runs); without one, only the gateway's own uid is the operator")
		case d.elsewhere != "" || d.client != "":
			d.fail("socket", err.Error(), start)
		default:
			d.fail("socket", err.Error(), "clawmesh up, or see <data>/logs/gateway.log")
		}
		return
	}
	defer c.Close()
	c.Timeout = 10 * time.Second
	d.ok("socket", socket+" answers")
	if d.client != "" {
		d.protocol(sf)
	}
	d.health(c)
}

// protocol says what initialize answered a client: its protocol, and whom
// the connection is bound as.
func (d *doctor) protocol(sf *socketFlags) {
	as := ""
	if sf.principal != "" {
		as = ", bound as " + sf.principal
	}
	if sf.withoutConfig != "" {
		as += " (the operator, without the config service: " + sf.withoutConfig + ")"
	}
	if sf.protocol != version.Protocol {
		d.fail("protocol", fmt.Sprintf("the gateway speaks protocol %d, this client %d%s", sf.protocol, version.Protocol, as),
			"use a clawmesh of the stack's version")
		return
	}
	d.ok("protocol", fmt.Sprintf("initialize answered: protocol %d%s", sf.protocol, as))
}

func (d *doctor) health(c *rpcclient.Client) {
	raw, err := c.Call("health", nil)
	if err != nil {
		d.fail("health", cliError(err).Error(), "")
		return
	}
	var h struct {
		Components map[string]struct {
			Status       string  `json:"status"`
			LastError    *string `json:"last_error"`
			RestartCount int     `json:"restart_count"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		d.fail("health", "undecodable answer: "+err.Error(), "")
		return
	}
	names := make([]string, 0, len(h.Components))
	for name := range h.Components {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		comp := h.Components[name]
		detail := comp.Status
		if comp.RestartCount > 0 {
			detail += fmt.Sprintf(", restarted %d time(s)", comp.RestartCount)
		}
		switch comp.Status {
		case "serving":
			d.ok(name, detail)
			continue
		case "dormant":
			d.ok(name, "dormant: starts when a client first connects to its socket")
			continue
		}
		if comp.LastError != nil && *comp.LastError != "" {
			detail += ": " + *comp.LastError
		}
		if d.client != "" {
			d.fail(name, detail, "see its log where the stack runs ("+filepath.Join("<data>", "logs", name+".log")+" under clawmesh up, its container's log in compose or Kubernetes)")
			continue
		}
		d.fail(name, detail, "see "+filepath.Join("<data>", "logs", name+".log"))
	}
	if raw, err := c.Call("status", nil); err != nil {
		// status needs the session service; a check left out unsaid
		// reads as one that passed.
		d.note("version", "not known: status failed: "+cliError(err).Error())
	} else {
		var st struct {
			ServerVersion string `json:"server_version"`
		}
		if json.Unmarshal(raw, &st) == nil {
			if st.ServerVersion == version.Version {
				d.ok("version", "stack and CLI are "+version.Version)
			} else {
				d.note("version", fmt.Sprintf("the stack says %s, this CLI is %s (rpc.advertised_server_version may set the former)", st.ServerVersion, version.Version))
			}
		}
	}
	d.plugins(c)
}

// plugins checks the plugins folder as the sandbox does before it loads
// anything from it, and names each plugin the sandbox did not load.
func (d *doctor) plugins(c *rpcclient.Client) {
	raw, err := c.Call("plugins/list", map[string]any{})
	if err != nil {
		d.note("plugins", "not listed: "+cliError(err).Error())
		return
	}
	var l struct {
		Enabled    bool          `json:"enabled"`
		PluginsDir string        `json:"plugins_dir"`
		Plugins    []pluginEntry `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &l); err != nil {
		d.fail("plugins", "undecodable answer: "+err.Error(), "")
		return
	}
	if !l.Enabled {
		d.note("plugins", "plugins.enabled is false: none load")
		return
	}
	if d.client != "" {
		// The folder is the stack's: a folder of that path here, or
		// none, says nothing of it. What the sandbox loaded, it said.
		d.pluginsLoaded(l.Plugins, l.PluginsDir+" (the stack's folder: clawmesh doctor where the stack runs checks it)")
		return
	}
	if _, err := os.Stat(l.PluginsDir); errors.Is(err, fs.ErrNotExist) && d.elsewhere != "" {
		d.note("plugins", l.PluginsDir+" is not in this container: the sandbox's containers hold it, and check it")
		return
	} else if errors.Is(err, fs.ErrNotExist) {
		d.note("plugins", l.PluginsDir+" does not exist yet: clawmesh plugin install creates it")
		return
	}
	if err := trust.CheckPluginsDir(l.PluginsDir); err != nil && d.elsewhere != "" && trust.CheckPluginsDirItself(l.PluginsDir) == nil {
		// The sandbox runs in containers of its own, where the folders
		// above this one are not these (in deploy/k8s its /data is the
		// image's 0700, this pod's an emptyDir): the plugins folder
		// itself is the part both see.
		d.note("plugins", "the folders above "+l.PluginsDir+" are checked by the sandbox in its own containers, not here ("+err.Error()+"); its log says \"plugins dir refused\" if they fail there")
	} else if err != nil {
		d.fail("plugins", "no plugin loads: "+err.Error(), "make it and the folders above it yours (or root's) and chmod go-w them")
		return
	}
	d.pluginsLoaded(l.Plugins, l.PluginsDir)
}

// pluginEntry is one plugin of plugins/list's answer.
type pluginEntry struct {
	Name   string `json:"name"`
	Dir    string `json:"dir"`
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// pluginsLoaded names each plugin the sandbox did not load, and counts
// those it did, loaded from where.
func (d *doctor) pluginsLoaded(plugins []pluginEntry, from string) {
	loaded := 0
	for _, p := range plugins {
		if p.Status == "loaded" {
			loaded++
			continue
		}
		name := p.Name
		if name == "" {
			name = p.Dir
		}
		d.fail("plugin "+name, p.Status+": "+p.Reason, "see "+filepath.Join("<data>", "logs", "plugin-sandbox.log"))
	}
	d.ok("plugins", fmt.Sprintf("%d of %d loaded from %s", loaded, len(plugins), from))
}
