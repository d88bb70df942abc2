package e2e_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
)

// clawmesh chat, driven as a script (its input is not a terminal): it
// opens a session, streams a scripted turn, asks the approval inline and
// shows the tool's result; the answer line decides the call.
func TestChatAnswersApprovalsInline(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{"--set", `agents.default.approval_required=["echo"]`}})
	cmd := exec.Command(filepath.Join(s.BinDir, "clawmesh"), "chat", "--config-dir", s.DataDir, "--socket", s.Socket)
	cmd.Stdin = strings.NewReader("/say ready\n" + `/tool echo {"n":7}` + "\no\n/say done\n/quit\n")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("chat: %v\n%s\n%s", err, out.String(), errb.String())
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("chat did not finish:\n%s\n%s", out.String(), errb.String())
	}
	got := out.String()
	for _, want := range []string{
		"session sess_",
		"ready",
		`[tool echo {"n":7}]`,
		"Allow the tool `echo` to run?",
		"allow once (o), always (a) or reject (r)? ",
		`[result echo completed: {"n":7}]`,
		"done",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("chat output lacks %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "Allow the tool") > strings.Index(got, "[result echo") {
		t.Fatalf("the tool ran before it was approved:\n%s", got)
	}
}

// clawmesh call reaches any method and prints a turn's updates as they
// come, then its result.
func TestCallAnyMethod(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	bin := filepath.Join(s.BinDir, "clawmesh")
	out, err := exec.Command(bin, "call", "session/new", `{"agent_alias":"default"}`, "--socket", s.Socket).Output()
	if err != nil {
		t.Fatalf("call session/new: %v %s", err, out)
	}
	var created struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal(out, &created); err != nil || created.SessionID == "" {
		t.Fatalf("session/new printed %s (%v)", out, err)
	}
	out, err = exec.Command(bin, "call", "--socket", s.Socket, "session/prompt",
		`{"session_id":"`+created.SessionID+`","prompt":"/say hi there"}`).Output()
	if err != nil {
		t.Fatalf("call session/prompt: %v %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], `"agent_message_chunk"`) || !strings.Contains(string(out), `"outcome": "completed"`) {
		t.Fatalf("call session/prompt printed:\n%s", out)
	}
	// An unknown method is the daemon's error, and a non-zero exit.
	out, err = exec.Command(bin, "call", "--socket", s.Socket, "no/such").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Unknown method: no/such (-32601)") {
		t.Fatalf("unknown method: %v %s", err, out)
	}
}
