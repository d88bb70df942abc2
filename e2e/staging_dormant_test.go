package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// wakeStaging wakes upload-staging the way an operator's grpcurl would:
// a health check on its socket, which the launcher holds until then; the
// call waits in the socket's backlog and is answered by the service.
func wakeStaging(t testing.TB, s *e2e.Stack) {
	t.Helper()
	cc, err := grpc.NewClient("unix://"+filepath.Join(s.DataDir, "upload-staging.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).Check(e2e.Context(t, 60*time.Second), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("upload-staging's health on its socket: %v, %v", resp, err)
	}
}

// A stack runs upload-staging only once a file is sent: until then the
// launcher holds its gRPC socket, status and health say "dormant" (no
// error), no process runs, and a client that uses the stack without
// sending a file (a session made, its connection closed) does not wake
// it. The first upload wakes it and lands; a killed upload-staging is
// restarted on the same socket; a stopped stack leaves neither socket nor
// marker, and the next stack sleeps again (it keeps nothing).
func TestUploadStagingSleepsUntilAFileIsSent(t *testing.T) {
	t.Parallel()
	dir := e2e.TempDataDir(t)
	s := e2e.Start(t, e2e.Options{DataDir: dir})
	sock := filepath.Join(dir, "upload-staging.sock")
	mark := filepath.Join(dir, "upload-staging.dormant")

	idle := dialUC(t, s)
	sess := idle.session(map[string]any{})
	waitState(t, idle.c, "upload-staging", "dormant")
	if _, inHealth, lastErr := serviceState(t, idle.c, "upload-staging"); inHealth != "dormant" || lastErr != nil {
		t.Fatalf("health: %q, last_error %v; want dormant with no error", inHealth, lastErr)
	}
	held, err := os.Stat(sock)
	if err != nil || held.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the dormant service's socket is not held: %v", err)
	}
	// sameSocket fails unless the socket file is still the launcher's:
	// a service that listened anew would replace it (and leave the
	// connections waiting in the held one unanswered).
	sameSocket := func(when string) {
		t.Helper()
		if fi, err := os.Stat(sock); err != nil || !os.SameFile(fi, held) {
			t.Fatalf("%s: upload-staging.sock is not the socket the launcher held (%v)", when, err)
		}
	}
	idle.c.Close()
	// Three health polls and a lease renewal's worth: still asleep.
	time.Sleep(1500 * time.Millisecond)
	if pid := s.PIDOf("upload-staging"); pid != 0 {
		t.Fatalf("upload-staging running (pid %d) with no file sent", pid)
	}

	// The first upload wakes it and lands.
	u := dialUC(t, s)
	data := randomBytes(t, mib+5)
	id := u.mustBegin(map[string]any{"session_id": sess.ID, "size_bytes": len(data), "filename": "first.bin"})
	first := s.PIDOf("upload-staging")
	if first == 0 {
		t.Fatal("an upload began with no upload-staging running")
	}
	u.sendAll(id, data)
	var fe fileEntry
	u.must("file/upload/commit", map[string]any{"upload_id": id}, &fe)
	if fe.SizeBytes != int64(len(data)) || fe.RefID != "sha256:"+hexSHA(data) {
		t.Fatalf("commit %+v", fe)
	}
	waitState(t, u.c, "upload-staging", "serving")
	sameSocket("once woken")
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Fatalf("dormant marker left once it serves: %v", err)
	}

	// Killed, it is restarted on the socket the launcher keeps, and
	// uploads go on.
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() error {
		if pid := s.PIDOf("upload-staging"); pid == 0 || pid == first {
			return fmt.Errorf("upload-staging pid %d (killed %d)", pid, first)
		}
		if _, re := u.begin(map[string]any{"session_id": sess.ID, "size_bytes": 1}); re != nil {
			return fmt.Errorf("begin after the restart: %s", re.Describe())
		}
		return nil
	})
	sameSocket("after a restart")

	s.Stop()
	for _, path := range []string{sock, mark} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("%s left after the stack stopped: %v", filepath.Base(path), err)
		}
	}
	s2 := e2e.Start(t, e2e.Options{DataDir: dir})
	c2 := s2.Dial(t)
	if _, err := c2.Initialize(); err != nil {
		t.Fatal(err)
	}
	waitState(t, c2, "upload-staging", "dormant")
	if pid := s2.PIDOf("upload-staging"); pid != 0 {
		t.Fatalf("upload-staging started with the next stack (pid %d)", pid)
	}
}
