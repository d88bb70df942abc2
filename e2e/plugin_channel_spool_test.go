package e2e_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
	"github.com/clawmesh/clawmesh/plugins/abi"
)

// keepDeadOwner writes, under the spool of data directory dataDir, the
// folder a replica that died leaves: sub (the alias's folder, then the
// plugin's in the current layout) holding owner folder "r-dead", its
// lock and one kept message per body, named as the release that wrote
// it named them.
func keepDeadOwner(t *testing.T, dataDir string, sub []string, names, bodies []string) string {
	t.Helper()
	owner := filepath.Join(append(append([]string{dataDir, "channel-spool"}, sub...), "r-dead")...)
	if err := os.MkdirAll(owner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(owner, "lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, body := range bodies {
		if err := os.WriteFile(filepath.Join(owner, names[i]), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return owner
}

// installWebhookAs installs the webhook example plugin a second time,
// named name: a second channel plugin of the same shape.
func installWebhookAs(t *testing.T, dataDir, name string) {
	t.Helper()
	installPlugin(t, dataDir, "webhook")
	from, to := filepath.Join(dataDir, "plugins", "webhook"), filepath.Join(dataDir, "plugins", name)
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"plugin.wasm", "manifest.toml"} {
		raw, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "manifest.toml" {
			raw = []byte(strings.Replace(string(raw), `name = "webhook"`, `name = "`+name+`"`, 1))
		}
		if err := os.WriteFile(filepath.Join(to, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// spoolOwnerOf is the replica (its pid) whose spool folder for channel
// "web" bound to plugin holds a kept message, with that folder; 0 while
// none does. A folder's owner is the process holding its lock open.
func spoolOwnerOf(t *testing.T, s *e2e.Stack, plugin string, replicas int) (int, string) {
	t.Helper()
	dir := filepath.Join(s.DataDir, "channel-spool", hex.EncodeToString([]byte("web")), "p-"+hex.EncodeToString([]byte(plugin)))
	owners, _ := os.ReadDir(dir)
	for _, o := range owners {
		folder := filepath.Join(dir, o.Name())
		if msgs, _ := filepath.Glob(filepath.Join(folder, "*.msg")); len(msgs) == 0 {
			continue
		}
		if pid := lockHolder(s, filepath.Join(folder, "lock"), replicas); pid != 0 {
			return pid, folder
		}
	}
	return 0, ""
}

// lockHolder is the sandbox replica (of replicas) that has file open.
func lockHolder(s *e2e.Stack, file string, replicas int) int {
	for pid, name := range s.PIDs() {
		if name != "plugin-sandbox" {
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			if to, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && to == file {
				return pid
			}
		}
	}
	return 0
}

// bindsWebTo reports whether sandbox process pid holds a spool folder of
// channel "web" bound to plugin: it opens one at its first such binding.
func bindsWebTo(s *e2e.Stack, pid int, plugin string) bool {
	locks, _ := filepath.Glob(filepath.Join(s.DataDir, "channel-spool", hex.EncodeToString([]byte("web")), "p-"+hex.EncodeToString([]byte(plugin)), "*", "lock"))
	for _, l := range locks {
		if lockHolder(s, l, 2) == pid {
			return true
		}
	}
	return false
}

// What a sandbox replica that died left in the spool of channel "web" is
// delivered by the bindings that follow, each message by its own plugin:
// a message webhook2 held when its replica was killed waits while the
// alias is bound to webhook (counted by status, not read by webhook), and
// is answered once the alias is bound to webhook2 again; a message the
// webhook binding held when its replica was killed is delivered by the
// replica that follows. The replicas are real (--scale plugin-sandbox=2)
// and killed with SIGKILL; the test planted a dead replica's folder
// before, which proved the layout but not that a real replica leaves it
// so. The messages of the release before the plugin-keyed layout (which
// name no plugin) cannot be made by this release: planted, they are
// delivered by the first binding. Those were only logged, and stayed on
// disk undelivered for good though their senders had been answered 202.
// A kept "message" that is a symlink is never followed.
func TestPluginChannelSpoolsKeptApartAndTheOldLayoutDelivered(t *testing.T) {
	t.Parallel()
	dataDir := e2e.TempDataDir(t)
	installWebhookAs(t, dataDir, "webhook2")
	alias := hex.EncodeToString([]byte("web"))
	msg := func(id, text string) []byte {
		return []byte(fmt.Sprintf(`{"id":%q,"from":"ann","text":%q,"thread":%q}`, id, text, id))
	}
	old := keepDeadOwner(t, dataDir, []string{alias},
		[]string{"00000000000000000001.msg"}, []string{string(msg("o1", "/say kept by the old release"))})
	secret := filepath.Join(filepath.Dir(dataDir), "outside.json")
	if err := os.WriteFile(secret, msg("s1", "/say read through a symlink"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(old, "00000000000000000002.msg")); err != nil {
		t.Fatal(err)
	}

	s := e2e.Start(t, e2e.Options{DataDir: dataDir, Args: []string{"--scale", "plugin-sandbox=2",
		"--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8"}})
	v := newConv(t, s, nil)
	hookURL, replies := channelhook.Contents(t)
	v.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "plugins.entries." + abi.InstanceKey("webhook2", abi.WorldChannel, "web") + ".config", "value": map[string]any{"webhook_url": hookURL, "token": "tok-e2e"}},
		{"prop": "channels.plugin.web.plugin", "value": "webhook2"},
		{"prop": "channels.plugin.web.token", "value": webChannelToken},
	}})
	listen := webChannelListen(t, v, "")
	waitFor(t, "the old release's message", 90*time.Second, func() bool { return len(replies()) >= 1 })

	// A message webhook2 holds (its turn sleeps) when its replica is
	// stopped; the alias moves to webhook, and then the replica is
	// killed: the replicas that bind webhook must leave its message.
	postWebMessage(t, listen, msg("w2", "/sleep 10000\n/say kept for webhook2"))
	var holder int
	waitFor(t, "the replica holding webhook2's message", 30*time.Second, func() bool {
		holder, _ = spoolOwnerOf(t, s, "webhook2", 2)
		return holder != 0
	})
	if err := syscall.Kill(holder, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	other := replicaPID(t, s, 0)
	index := 1
	if other == holder {
		other, index = replicaPID(t, s, 1), 0
	}
	bindWebChannel(t, v, hookURL)
	waitFor(t, "the other replica's binding of webhook", 60*time.Second, func() bool { return bindsWebTo(s, other, "webhook") })
	if err := syscall.Kill(holder, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, index, holder); err != nil {
		t.Fatal(err)
	}
	restarted := replicaPID(t, s, index)
	waitFor(t, "the restarted replica's binding of webhook", 60*time.Second, func() bool { return bindsWebTo(s, restarted, "webhook") })
	// Neither binding of webhook read it; both looked and left it.
	waitFor(t, "the other plugin's message counted", 30*time.Second, func() bool {
		for _, log := range replicaLogs(s, 2) {
			if strings.Contains(readFile(log), "messages accepted for another plugin of this alias") {
				return true
			}
		}
		return false
	})
	// Once the restarted replica serves (status exits 1 until then).
	var out string
	waitFor(t, "status with every replica serving", 60*time.Second, func() bool {
		var err error
		out, err = clawmesh(t, s, "status")
		return err == nil
	})
	if !regexp.MustCompile(`"web" → webhook2 +1 kept, oldest \S+ old`).MatchString(out) {
		t.Fatalf("status does not count the killed replica's message for webhook2:\n%s", out)
	}

	// A message webhook holds when its replica is killed is delivered
	// by a replica that follows (the other one, or the restarted one).
	listen = webChannelListen(t, v, "")
	postWebMessage(t, listen, msg("w1", "/sleep 6000\n/say kept for webhook"))
	var victim int
	waitFor(t, "the replica holding webhook's message", 30*time.Second, func() bool {
		victim, _ = spoolOwnerOf(t, s, "webhook", 2)
		return victim != 0
	})
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "webhook's message, its replica killed", 90*time.Second, func() bool { return len(replies()) >= 2 })
	if got := replies(); !slices.Equal(got, []string{"kept by the old release", "kept for webhook"}) {
		t.Fatalf("replies %q, want the old release's message, then webhook's (not webhook2's while webhook is bound)", got)
	}

	v.call("config/set", map[string]any{"prop": "channels.plugin.web.plugin", "value": "webhook2"})
	waitFor(t, "the webhook2 binding's kept message", 90*time.Second, func() bool { return len(replies()) >= 3 })
	got := replies()
	if len(got) != 3 || got[2] != "kept for webhook2" {
		t.Fatalf("replies %q, want webhook2's message answered once it was bound", got)
	}
	if raw, err := os.ReadFile(secret); err != nil || !strings.Contains(string(raw), "s1") {
		t.Fatalf("the symlink's target: %q, %v", raw, err)
	}
	for _, r := range got {
		if strings.Contains(r, "symlink") {
			t.Fatalf("a symlink in the spool was read: replies %q", got)
		}
	}
}

// Messages kept for a plugin nobody binds again stayed on disk for good:
// status counted them and named no way out but removing folders by hand
// with the stack stopped. Past a day status (and health --config-dir)
// now say they wait, with their bytes, and spool drop removes them: not
// while a running replica holds the alias's spool for that plugin (the
// alias bound to it), and never for a name that is not an alias.
func TestSpoolDropOfAPluginNeverBoundAgain(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)
	hookURL, _ := channelhook.Contents(t)
	bindWebChannel(t, v, hookURL)
	webChannelListen(t, v, "")
	body := `{"id":"g1","from":"ann","text":"/say for a plugin removed","thread":"g1"}`
	owner := keepDeadOwner(t, s.DataDir, []string{hex.EncodeToString([]byte("web")), "p-" + hex.EncodeToString([]byte("gone"))},
		[]string{"00000000000000000001-hostmsg_0123456789abcdef01234569.msg"}, []string{body})
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(owner, "00000000000000000001-hostmsg_0123456789abcdef01234569.msg"), old, old); err != nil {
		t.Fatal(err)
	}

	out, err := clawmesh(t, s, "status")
	want := regexp.MustCompile(`"web" → gone +1 kept, oldest 4[78]h\S* old, ` + fmt.Sprint(len(body)) + ` B +WAITING past 24h0m0s or 64.0 MiB: .*clawmesh spool drop web --plugin gone`)
	if err != nil || !want.MatchString(out) {
		t.Fatalf("status does not warn of the message waiting for plugin gone (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "health", "--config-dir", s.DataDir, "plugin-sandbox"); err != nil ||
		!strings.Contains(out, "channel spool: 1 messages kept, not delivered yet ("+fmt.Sprint(len(body))+" B)") || !strings.Contains(out, "WAITING") {
		t.Fatalf("health --config-dir does not count the spool (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "spool", "list"); err != nil || !want.MatchString(out) {
		t.Fatalf("spool list (%v):\n%s", err, out)
	}
	// The alias is bound to webhook: its spool is the running replica's.
	if out, err := clawmesh(t, s, "spool", "drop", "web"); err == nil || !strings.Contains(out, "held by a running sandbox replica") || !strings.Contains(out, "webhook") {
		t.Fatalf("spool drop of the bound alias (%v):\n%s", err, out)
	}
	if _, err := os.Stat(owner); err != nil {
		t.Fatalf("a refused drop removed the kept message: %v", err)
	}
	if out, err := clawmesh(t, s, "spool", "drop", "../web"); err == nil || !strings.Contains(out, "not a channel alias") {
		t.Fatalf("spool drop of a path (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "spool", "drop", "web", "--plugin", "gone"); err != nil || !strings.Contains(out, "dropped 1 kept channel messages") {
		t.Fatalf("spool drop --plugin gone (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "spool", "list"); err != nil || !strings.Contains(out, "no channel messages kept") {
		t.Fatalf("spool list after the drop (%v):\n%s", err, out)
	}
	if out, err := clawmesh(t, s, "status"); err != nil || strings.Contains(out, "gone") {
		t.Fatalf("status after the drop (%v):\n%s", err, out)
	}
	// Unbound (every plugin unloaded), the alias's spool is no running
	// replica's any more: the sandbox held its lock until it stopped,
	// and drop was refused for an alias nothing bound.
	v.call("config/set", map[string]any{"prop": "plugins.enabled", "value": false})
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error {
		out, err := clawmesh(t, s, "spool", "drop", "web")
		if err == nil && strings.Contains(out, "dropped 0 kept channel messages") {
			return nil
		}
		return fmt.Errorf("spool drop of the alias once unbound: %v: %s", err, out)
	})
}

// Two sandbox replicas share a channel's listener and its spool, and its
// bound (channels.plugin.<alias>.spool_max_mb) held for each replica
// alone: each counted the other's folder as of its last look (at bind,
// then every 5 s), so replicas taking messages at once kept up to the
// bound each. Here both take messages of one conversation (its turn
// sleeps: every message stays on disk) until each has refused one for
// the bound: what the spool holds, over both replicas, never passes the
// bound, and it takes the five messages the bound holds.
func TestPluginChannelSpoolBoundHeldAcrossReplicas(t *testing.T) {
	t.Parallel()
	s := pluginStack(t, []string{"webhook"}, "--scale", "plugin-sandbox=2",
		"--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8",
		"--set", "channels.plugin.web.spool_max_mb=1")
	v := newConv(t, s, nil)
	hookURL, _ := channelhook.Contents(t)
	listen := bindWebChannelOnBothReplicas(t, s, v, hookURL)
	spool := filepath.Join(s.DataDir, "channel-spool")
	const bound = 1 << 20
	// Fresh connections: the kernel spreads them over both replicas.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	accepted := 0
	refusedBoth := func() bool {
		for _, l := range replicaLogs(s, 2) {
			if !strings.Contains(readFile(l), "channel spool at its bound") {
				return false
			}
		}
		return true
	}
	for i := 0; !refusedBoth(); i++ {
		if i == 60 {
			t.Fatalf("after %d messages not both replicas refused one for the bound: the kernel did not spread the connections", i)
		}
		// About 200 kB, 49 blocks: five fit 1 MiB.
		body, _ := json.Marshal(map[string]string{"id": fmt.Sprintf("b%d", i), "from": "ann", "thread": "held",
			"text": "/sleep 60000\n" + strings.Repeat("x", 200_000)})
		req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+webChannelToken)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusAccepted:
			accepted++
		case resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(text), "at its bound, 1 MiB"):
			t.Fatalf("message %d: %s %q", i, resp.Status, text)
		}
		if held := spoolHolds(spool); held > bound {
			t.Fatalf("after message %d (%d taken) the spool holds %d bytes over both replicas, past its bound of %d", i, accepted, held, bound)
		}
	}
	if accepted != 5 {
		t.Fatalf("%d messages taken, want the 5 the bound holds", accepted)
	}
}

// spoolHolds is what the messages kept under spool cost, as the bound
// counts them: whole 4 KiB blocks.
func spoolHolds(spool string) int64 {
	var n int64
	_ = filepath.WalkDir(spool, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(d.Name(), ".msg") {
			if fi, err := d.Info(); err == nil {
				n += max(4096, (fi.Size()+4095)&^4095)
			}
		}
		return nil
	})
	return n
}
