package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/clawmesh/clawmesh/internal/bus"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/natsembed"
	"github.com/clawmesh/clawmesh/internal/natsutil"
	"github.com/clawmesh/clawmesh/internal/pgcluster"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// The attacker: the test binary run again under another Unix account,
// which tries what a local user would and prints what happened.
const attackEnv = "CLAWMESH_E2E_ATTACK"

// attack is what the attacker is told to try.
type attack struct {
	DataDir, NATSURL, PGDir, ChildPID string
}

// attackResult is the outcome of each try: "" when it worked, else the
// error.
type attackResult map[string]string

func init() {
	// Before TestMain: this process is the attacker, not a test run.
	if spec := os.Getenv(attackEnv); spec != "" {
		var a attack
		if err := json.Unmarshal([]byte(spec), &a); err != nil {
			fmt.Println(`{"spec":"` + err.Error() + `"}`)
			os.Exit(2)
		}
		out, _ := json.Marshal(runAttack(a))
		fmt.Println(string(out))
		os.Exit(0)
	}
}

func runAttack(a attack) attackResult {
	res := attackResult{}
	try := func(name string, fn func() error) {
		if err := fn(); err != nil {
			res[name] = err.Error()
		} else {
			res[name] = ""
		}
	}
	try("read bus seed", func() error {
		_, err := os.ReadFile(bus.SeedFile(a.DataDir, bus.RoleConfig))
		return err
	})
	try("list data dir", func() error {
		_, err := os.ReadDir(a.DataDir)
		return err
	})
	try("read postgres password", func() error {
		_, err := os.ReadFile(filepath.Join(a.DataDir, "postgres.password"))
		return err
	})
	try("read a child's environment", func() error {
		_, err := os.ReadFile("/proc/" + a.ChildPID + "/environ")
		return err
	})
	try("dial client socket", func() error { return dial(filepath.Join(a.DataDir, "daemon.sock")) })
	try("dial session gRPC socket", func() error { return dial(filepath.Join(a.DataDir, "session.sock")) })
	try("dial postgres socket", func() error { return dial(filepath.Join(a.PGDir, ".s.PGSQL.5432")) })
	try("nats anonymous", func() error { return natsTry(a.NATSURL, nil) })
	kp, _ := nkeys.CreateUser()
	try("nats unknown nkey", func() error { return natsTry(a.NATSURL, kp) })
	return res
}

func dial(path string) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// natsTry connects (with kp, when given), and if that works, tries what
// an attacker would do with a connection: read every session's updates,
// announce a config change.
func natsTry(u string, kp nkeys.KeyPair) error {
	opts := []nats.Option{nats.Timeout(3 * time.Second), nats.NoReconnect()}
	if kp != nil {
		pub, _ := kp.PublicKey()
		opts = append(opts, nats.Nkey(pub, kp.Sign))
	}
	nc, err := nats.Connect(u, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync(">"); err != nil {
		return err
	}
	if err := bus.PublishConfigChanged(nc, 1<<40, []string{"agents.default.base_url"}); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	return nc.LastError()
}

// natsURLOf reads the bus URL from a child's environment, where the
// launcher puts it (an operator's NATS_URL may carry a credential), and
// checks that no child's command line names it.
func natsURLOf(t *testing.T, s *e2e.Stack) string {
	t.Helper()
	url := ""
	for pid := range s.PIDs() {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for _, kv := range strings.Split(string(raw), "\x00") {
			if v, ok := strings.CutPrefix(kv, "NATS_URL="); ok {
				url = v
			}
		}
	}
	if url == "" {
		t.Fatal("no child names the bus")
	}
	for pid := range s.PIDs() {
		if raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(raw), url) {
			t.Fatalf("pid %d names the bus on its command line: %q", pid, raw)
		}
	}
	return url
}

// newAccount creates a Unix account for the test and removes it after.
func newAccount(t *testing.T) *user.User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a second Unix account needs root")
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skip("no useradd to create a second Unix account")
	}
	name := fmt.Sprintf("cmx%06d", rand.IntN(1000000))
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// runAs runs this test binary as the attacker under u.
func runAs(t *testing.T, u *user.User, a attack) attackResult {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The build folder is root's alone: a copy the account may run.
	dir, err := os.MkdirTemp("", "cm-attacker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "attacker")
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(dst, src)
	src.Close()
	if cerr := dst.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	spec, _ := json.Marshal(a)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd := exec.Command(bin)
	cmd.Env = []string{attackEnv + "=" + string(spec), "HOME=/", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("attacker: %v %s", err, out)
	}
	var res attackResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("attacker said %q: %v", out, err)
	}
	return res
}

// A second Unix account reaches nothing of the stack: no seed, no socket
// (client, gRPC, PostgreSQL), no child's environment, and the bus refuses
// it with no credential or with one of its own making, so it can neither
// read a session's updates nor announce a config change.
func TestSecondAccountReachesNothing(t *testing.T) {
	t.Parallel()
	u := newAccount(t)
	s := e2e.Start(t, e2e.Options{PrivateCluster: true})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	child := s.PIDOf("session")
	a := attack{DataDir: s.DataDir, NATSURL: natsURLOf(t, s), PGDir: pgcluster.Dir(s.DataDir), ChildPID: strconv.Itoa(child)}
	res := runAs(t, u, a)
	for try, want := range map[string]string{
		"read bus seed":              "permission denied",
		"list data dir":              "permission denied",
		"read postgres password":     "permission denied",
		"read a child's environment": "permission denied",
		"dial client socket":         "permission denied",
		"dial session gRPC socket":   "permission denied",
		"dial postgres socket":       "permission denied",
		"nats anonymous":             "Authorization Violation",
		"nats unknown nkey":          "Authorization Violation",
	} {
		got, ok := res[try]
		if !ok || !strings.Contains(strings.ToLower(got), strings.ToLower(want)) {
			t.Errorf("%s as %s: %q, want %q", try, u.Username, got, want)
		}
	}
	// The stack did not notice.
	if _, err := c.Call("status", map[string]any{}); err != nil {
		t.Fatal(err)
	}
}

// A config change announced on the bus with the config service's own
// credential, naming a revision the service does not have, changes
// nothing anywhere: the config reads the same, turns run as before, and
// consumers are not pinned to it: the next real commit reaches them.
func TestForgedConfigChangeChangesNothing(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	v := newConv(t, s, map[string]any{"elicitation": map[string]any{}})
	id := v.newSession("")
	v.call("config/set", map[string]any{"prop": "agents.default.system_prompt", "value": "real"})
	before := v.call("config/get", map[string]any{"prop": "agents.default"})

	seed, err := bus.LoadSeed(s.DataDir, bus.RoleConfig)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := natsutil.Connect(natsutil.Options{URL: natsURLOf(t, s), Name: "forger", Seed: seed, InboxPrefix: bus.RoleConfig.InboxPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, rev := range []int64{1 << 40, 1<<40 + 1} {
		if err := bus.PublishConfigChanged(nc, rev, []string{"agents.default.base_url", "agents.default.provider", "agents.default.approval_required"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// Turns keep running on the configured (scripted) provider; give the
	// consumers time to have read the announcement.
	for range 5 {
		var pr struct{ Outcome, Content string }
		json.Unmarshal(v.call("session/prompt", map[string]any{"session_id": id, "prompt": "/say still mine"}), &pr)
		if pr.Outcome != "completed" || pr.Content != "still mine" {
			t.Fatalf("turn after the forged announcement: %+v", pr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if after := v.call("config/get", map[string]any{"prop": "agents.default"}); string(after) != string(before) {
		t.Fatalf("config changed:\nbefore %s\nafter  %s", before, after)
	}
	// Not pinned: a real commit after it is followed.
	v.call("config/set-many", map[string]any{"sets": []map[string]any{
		{"prop": "agents.default.approval_required", "value": []string{"echo"}},
		{"prop": "agents.default.approval_timeout_secs", "value": 30},
	}})
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		ups := approvalTurn(t, v, id, `{"action":"accept","content":{"choice":"allow_once"}}`)
		if countType(ups, "approval_request") != 1 {
			return errors.New("the real commit after the forged announcement is not followed")
		}
		return nil
	})
}

// A non-owner's session/prompt on a live session during a long turn gets
// a refusal and not one frame of that turn; ids that would be wildcards,
// add a token, or that NATS would refuse (*, >, a.b, 5 KB, a space) are
// refused with -32602 before they touch the bus, and every other client
// keeps streaming and opening sessions afterwards.
func TestNonOwnerSeesNothingAndBadIDsBreakNothing(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := newConv(t, s, nil)
	opSession := op.newSession("")
	token := aliceChats(t, s, op)
	alice := &conv{t: t, c: s.Dial(t), n: 100}
	if _, err := alice.c.Call("initialize", map[string]any{"protocol_version": 1, "auth_token": token}); err != nil {
		t.Fatal(err)
	}
	other := newConv(t, s, nil) // a bystander, streaming its own turn

	words := strings.Repeat("stream ", 300)
	longTurn := "/say start\n/sleep 1000\n/say " + words + "\n/sleep 1000\n/say " + words + "\n/say end"
	opPrompt := op.send("session/prompt", map[string]any{"session_id": opSession, "prompt": longTurn})
	if u, ok := op.upd(op.next()); !ok || u.Type != "agent_message_chunk" {
		t.Fatal("the operator's turn did not start")
	}
	otherSession := other.newSession("")
	otherPrompt := other.send("session/prompt", map[string]any{"session_id": otherSession, "prompt": longTurn})

	// Alice, pipelined, on the operator's live session: refused each time.
	// Bad ids, from alice and from a second connection of the operator.
	aliceWant, opBadWant := map[string]int64{}, map[string]int64{}
	names := map[string]string{}
	for range 5 {
		aliceWant[alice.send("session/prompt", map[string]any{"session_id": opSession, "prompt": "/say mine now"})] = -32003
	}
	aliceWant[alice.send("session/new", map[string]any{"session_id": opSession})] = -32003
	opBad := newConv(t, s, nil)
	for _, id := range []string{"*", ">", "a.b", strings.Repeat("x", 5000), "a b", "clawmesh.session.*.update"} {
		for _, m := range []string{"session/prompt", "session/new", "session/state", "session/messages", "session/cancel"} {
			params := map[string]any{"session_id": id, "prompt": "/say x"}
			r := alice.send(m, params)
			aliceWant[r], names[r] = -32602, m+" "+strconv.Quote(id[:min(len(id), 20)])
			r = opBad.send(m, params)
			opBadWant[r], names[r] = -32602, m+" "+strconv.Quote(id[:min(len(id), 20)])
		}
	}
	// readAnswers reads until every call in want is answered, checking
	// each code, and counts the update frames that came meanwhile.
	readAnswers := func(cv *conv, want map[string]int64) (updates int) {
		for len(want) > 0 {
			f := cv.next()
			if f.Method == "session/update" {
				updates++
				continue
			}
			code, ok := want[string(f.ID)]
			if !ok {
				continue
			}
			delete(want, string(f.ID))
			if f.Error == nil || f.Error.Code != code {
				t.Errorf("%s %s: %+v, want %d", f.ID, names[string(f.ID)], f.Error, code)
			}
		}
		return updates
	}
	leak := readAnswers(alice, aliceWant)
	readAnswers(opBad, opBadWant)

	// Both turns stream to their end.
	opUps, opResp := op.until(opPrompt)
	otherUps, otherResp := other.until(otherPrompt)
	for name, r := range map[string]*e2e.Frame{"operator": opResp, "bystander": otherResp} {
		if r.Error != nil {
			t.Fatalf("%s's turn: %v", name, r.Error)
		}
	}
	if countType(opUps, "turn_complete") != 1 || countType(otherUps, "turn_complete") != 1 || len(opUps) < 600 || len(otherUps) < 600 {
		t.Fatalf("turns cut short: operator %d updates, bystander %d", len(opUps), len(otherUps))
	}
	// Alice saw none of it: one more call, and nothing before its answer.
	ups, f := alice.until(alice.send("session/list", map[string]any{}))
	if f.Error != nil {
		t.Fatal(f.Error)
	}
	if leak+len(ups) != 0 {
		t.Fatalf("alice received %d update frames of a session not hers", leak+len(ups))
	}
	// And the gateway serves new sessions and streams as before.
	fresh := newConv(t, s, nil)
	freshSession := fresh.newSession("")
	ups, resp := fresh.until(fresh.send("session/prompt", map[string]any{"session_id": freshSession, "prompt": "/say after the bad ids"}))
	if resp.Error != nil || countType(ups, "agent_message_chunk") == 0 {
		t.Fatalf("a new session after the bad ids: %v %+v", resp.Error, ups)
	}
	if err := upServing(fresh.c); err != nil {
		t.Fatal(err)
	}
}

// No secret on any command line: a stack started with an API key in
// --set-file (as the README recommends), another in a plain --set, and
// DATABASE_URL carrying a password: no child's argv holds any of them
// (the launcher's own argv holds the plain --set: that is why the file
// exists).
func TestNoSecretOnAnyCommandLine(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pgDir, err := os.MkdirTemp("", "cm-argv-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pgDir) })
	cl, err := pgcluster.Start(ctx, pgcluster.Options{Dir: pgDir, Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	dbURL := cl.URL()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	password, ok := u.User.Password()
	if !ok {
		// An ordinary user's cluster trusts its socket: give the role a
		// password anyway, so the URL carries one as a real one would.
		password = "pw-" + strconv.Itoa(rand.IntN(1<<30))
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "ALTER ROLE clawmesh PASSWORD '"+password+"'")
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(u.User.Username(), password)
		dbURL = u.String()
	}
	fileSecret := "sk-from-the-file-" + strconv.Itoa(rand.IntN(1<<30))
	plainSecret := "sk-plain-set-" + strconv.Itoa(rand.IntN(1<<30))
	setFile := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(setFile, []byte("# keys\nagents.x.api_key="+fileSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Options{
		Args: []string{"--set-file", setFile, "--set", "agents.y.api_key=" + plainSecret},
		Env:  []string{"DATABASE_URL=" + dbURL},
	})
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	// The secrets were applied (read back masked), the external database
	// used (no private cluster started).
	for _, prop := range []string{"agents.x.api_key", "agents.y.api_key"} {
		if got := call(t, c, "config/get", map[string]any{"prop": prop}); got["value"] == "" || got["value"] == fileSecret || got["value"] == plainSecret {
			t.Fatalf("%s reads %v", prop, got["value"])
		}
	}
	phone(t, s) // wakes the durable bridge, whose command line counts too
	wakeStaging(t, s)
	pids := s.PIDs()
	if len(pids) != 6 {
		t.Fatalf("want five services and the gateway, no private postgres: %v", pids)
	}
	for pid, name := range pids {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatal(err)
		}
		argv := string(raw)
		for what, secret := range map[string]string{"the --set-file key": fileSecret, "the --set key": plainSecret,
			"the database password": password, "the database URL": dbURL} {
			if strings.Contains(argv, secret) {
				t.Errorf("%s (%d) has %s on its command line: %q", name, pid, what, strings.ReplaceAll(argv, "\x00", " "))
			}
		}
	}
	launcher, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.LauncherPID()))
	if strings.Contains(string(launcher), fileSecret) || strings.Contains(string(launcher), password) {
		t.Errorf("the launcher's own command line has the file's key or the database password")
	}
}

// externalBus is a stack on a bus server of the test's (NATS_URL), which
// the test may shut down and start again on the same port.
type externalBus struct {
	t    *testing.T
	s    *e2e.Stack
	keys map[bus.Role]string
	port int
	srv  *server.Server
}

func startOnExternalBus(t *testing.T) *externalBus {
	t.Helper()
	b, dir := newExternalBus(t, nil)
	b.s = e2e.Start(t, e2e.Options{DataDir: dir, Env: []string{fmt.Sprintf("NATS_URL=nats://127.0.0.1:%d", b.port)}})
	return b
}

// newExternalBus makes a data directory, with plugins installed, and
// runs a bus server of the test's on a free port with that directory's
// credentials; the caller starts the stack (b.s) on dir.
func newExternalBus(t *testing.T, plugins []string) (b *externalBus, dir string) {
	t.Helper()
	dir = e2e.TempDataDir(t)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range plugins {
		installPlugin(t, dir, p)
	}
	keys, err := bus.EnsureCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b = &externalBus{t: t, keys: keys, port: l.Addr().(*net.TCPAddr).Port}
	l.Close()
	b.srv = busServer(t, b.port, keys)
	return b, dir
}

func (b *externalBus) shutdown() { b.srv.Shutdown() }
func (b *externalBus) start()    { b.srv = busServer(b.t, b.port, b.keys) }

// busServer runs a nats-server on port admitting the given identities,
// as an operator's external NATS_URL server would.
func busServer(t *testing.T, port int, keys map[bus.Role]string) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true,
		Nkeys: natsembed.Users(keys)})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// A broken bus is not a healthy stack. The bus server goes away: every
// process says not_serving with the bus as the reason (status and
// health), and comes back by itself when the server does. A server that
// then refuses the session service's credential closes its connection for
// good: the process exits, the launcher restarts it (and keeps doing so
// while the bus refuses it), and once the bus admits it again it serves.
func TestBusLossMakesHealthTellAndRestarts(t *testing.T) {
	t.Parallel()
	b := startOnExternalBus(t)
	s := b.s
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	phone(t, s) // the durable bridge, woken, must tell of the bus too
	wakeStaging(t, s)
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error { return allServing(c, allServices) })

	// The server goes away.
	b.shutdown()
	lost := time.Now()
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		h, err := healthOf(c)
		if err != nil {
			return err
		}
		for _, name := range allServices {
			comp := h[name]
			if comp.Status != "not_serving" || comp.LastError == nil || !strings.Contains(*comp.LastError, "bus") {
				return fmt.Errorf("%s: %+v", name, comp)
			}
		}
		st, err := status(c)
		if err != nil {
			return err
		}
		for _, name := range allServices {
			if st.Services[name] != "not_serving" {
				return fmt.Errorf("status says %s is %q", name, st.Services[name])
			}
		}
		return nil
	})
	h, _ := healthOf(c)
	t.Logf("%v after the bus went away, health says session %s: %s", time.Since(lost).Round(time.Millisecond), h["session"].Status, *h["session"].LastError)

	// Back, refusing the session service: its connection closes for good,
	// the process exits and is restarted, again and again.
	refusing := map[bus.Role]string{}
	for r, k := range b.keys {
		if r != bus.RoleSession {
			refusing[r] = k
		}
	}
	old := s.PIDOf("session")
	b.srv = busServer(t, b.port, refusing)
	testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
		if p := s.PIDOf("session"); p == 0 || p == old {
			return errors.New("session not restarted after its bus connection closed")
		}
		return nil
	})
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		if !strings.Contains(readLog(t, s, "session"), "bus connection closed for good, stopping") {
			return errors.New("the session service did not say why it stopped")
		}
		return nil
	})
	// The others, admitted, come back by themselves (status needs the
	// session service: read health).
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		h, err := healthOf(c)
		if err != nil {
			return err
		}
		for _, name := range []string{"config", "upload-staging", "plugin-sandbox", "durable-bridge"} {
			if h[name].Status != "serving" {
				return fmt.Errorf("%s did not come back with the bus: %+v", name, h[name])
			}
		}
		return nil
	})

	// Admitted again: it serves, its restarts counted.
	b.shutdown()
	b.start()
	back := time.Now()
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() error { return allServing(c, allServices) })
	// The restarts were announced while the bus refused the session and
	// the gateway may have been reconnecting: the launcher says the
	// counts again every two seconds.
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() error {
		var err error
		if h, err = healthOf(c); err != nil {
			return err
		}
		if h["session"].RestartCount < 1 {
			return fmt.Errorf("session restart count %d", h["session"].RestartCount)
		}
		return nil
	})
	t.Logf("every service serving %v after the bus admitted the session again; session restarted %d times meanwhile",
		time.Since(back).Round(time.Millisecond), h["session"].RestartCount)
}

// gatewayWord is what status and health say of the gateway itself: its
// status word in each, and health's last_error.
func gatewayWord(c *e2e.Client) (inStatus, inHealth, lastError string, err error) {
	st, err := status(c)
	if err != nil {
		return "", "", "", err
	}
	h, err := healthOf(c)
	if err != nil {
		return "", "", "", err
	}
	if e := h["gateway"].LastError; e != nil {
		lastError = *e
	}
	return st.Services["gateway"], h["gateway"].Status, lastError, nil
}

// The gateway's own bus link is what carries every session/update to a
// client: while it is down, status and health say the gateway is
// not_serving, with the bus as the reason, even though every service may
// serve; once it is back they say serving again. Before, only the
// gateway's gRPC health said so, and a client was told all was well while
// no update could reach it.
func TestBusLossTellsClientsTheGatewayCannotDeliver(t *testing.T) {
	t.Parallel()
	b := startOnExternalBus(t)
	s := b.s
	c := s.Dial(t)
	if _, err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, 100*time.Millisecond, func() error {
		inStatus, inHealth, _, err := gatewayWord(c)
		if err != nil {
			return err
		}
		if inStatus != "serving" || inHealth != "serving" {
			return fmt.Errorf("gateway: status says %q, health %q", inStatus, inHealth)
		}
		return nil
	})

	b.shutdown()
	lost := time.Now()
	var why string
	testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
		inStatus, inHealth, lastError, err := gatewayWord(c)
		if err != nil {
			return err
		}
		if inStatus != "not_serving" || inHealth != "not_serving" || !strings.Contains(lastError, "bus") {
			return fmt.Errorf("gateway with its bus link down: status says %q, health %q (%q)", inStatus, inHealth, lastError)
		}
		why = lastError
		return nil
	})
	t.Logf("%v after the bus went away, the gateway is not_serving: %s", time.Since(lost).Round(time.Millisecond), why)

	b.start()
	back := time.Now()
	testenv.Eventually(t, 15*time.Second, 50*time.Millisecond, func() error {
		inStatus, inHealth, _, err := gatewayWord(c)
		if err != nil {
			return err
		}
		if inStatus != "serving" || inHealth != "serving" {
			return fmt.Errorf("gateway with its bus link back: status says %q, health %q", inStatus, inHealth)
		}
		return nil
	})
	t.Logf("%v after the bus came back, the gateway is serving", time.Since(back).Round(time.Millisecond))
}

// Revoking a user's tokens ends the authority of the connections they
// bound (docs/spec.md §4). Only a prompt and a new session asked the config
// service: on her open connection, alice read her transcript, listed,
// closed and deleted her sessions after the revocation. Every session
// method now refuses her, and the operator's calls go on.
func TestRevokedTokenEndsTheSessionsAuthority(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	op := newConv(t, s, nil)
	token := aliceChats(t, s, op)
	alice := &conv{t: t, c: s.Dial(t), n: 100}
	if _, err := alice.c.Call("initialize", map[string]any{"protocol_version": 1, "auth_token": token}); err != nil {
		t.Fatal(err)
	}
	mine := alice.newSession("")
	other := alice.newSession("")
	alice.call("session/prompt", map[string]any{"session_id": mine, "prompt": "/say before"})
	alice.call("session/messages", map[string]any{"session_id": mine})

	if out, err := clawmesh(t, s, "token", "revoke", "--user", "alice"); err != nil {
		t.Fatalf("token revoke: %v\n%s", err, out)
	}
	for _, c := range []struct {
		method string
		params map[string]any
	}{
		{"session/messages", map[string]any{"session_id": mine}},
		{"session/list", map[string]any{}},
		{"session/state", map[string]any{"session_id": mine}},
		{"session/cancel", map[string]any{"session_id": mine}},
		{"session/close", map[string]any{"session_id": other}},
		{"session/kill", map[string]any{"session_id": other}},
		{"session/delete", map[string]any{"session_id": mine}},
		{"session/new", map[string]any{"session_id": mine}},
		{"session/prompt", map[string]any{"session_id": mine, "prompt": "/say after"}},
	} {
		_, err := alice.c.Call(c.method, c.params)
		if !isCode(err, -32012) || !strings.Contains(err.Error(), `the token of user "alice" was revoked`) {
			t.Fatalf("%s after the revocation: %v", c.method, err)
		}
	}
	// Her sessions are as they were: the operator reads them.
	op.call("session/messages", map[string]any{"session_id": mine})
	op.call("session/close", map[string]any{"session_id": other})
}
