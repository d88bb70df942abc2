package main

import (
	"bufio"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// fakeStack serves the client socket the way the gateway does, for what
// chat and doctor need: initialize, session/new, session/state of known
// sessions (others are -32000), health (the gateway serving), status
// failing as with the session service down. A session/prompt closes the
// connection, as a gateway that dies (or a stack that stops) mid-turn
// does.
func fakeStack(t *testing.T, known ...string) string {
	return fakeSocket(t, func(conn net.Conn) { serveFake(conn, known) })
}

// fakeSocket listens on a client socket until the test ends and runs
// serve on each connection.
func fakeSocket(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "daemon.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(conn)
		}
	}()
	return sock
}

func serveFake(conn net.Conn, known []string) {
	defer conn.Close()
	lines := bufio.NewScanner(conn)
	for lines.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				SessionID string `json:"session_id"`
				AuthToken string `json:"auth_token"`
			} `json:"params"`
		}
		if json.Unmarshal(lines.Bytes(), &req) != nil {
			return
		}
		var result, rpcErr any
		switch req.Method {
		case "initialize":
			result = map[string]any{"protocol_version": 1}
			if req.Params.AuthToken == "refused-token" {
				result, rpcErr = nil, map[string]any{"code": -32010, "message": "auth_token is not paired"}
			}
		case "session/new":
			id := req.Params.SessionID
			if id == "" {
				id = "sess_new"
			}
			result = map[string]any{"session_id": id, "agent_alias": "default", "message_count": 0}
		case "session/state":
			rpcErr = map[string]any{"code": -32000, "message": "Session " + req.Params.SessionID + " not found"}
			for _, k := range known {
				if k == req.Params.SessionID {
					result, rpcErr = map[string]any{"session_id": k, "state": "idle"}, nil
				}
			}
		case "session/prompt":
			return
		case "health":
			result = map[string]any{"components": map[string]any{"gateway": map[string]any{"status": "serving"}}}
		case "status":
			rpcErr = map[string]any{"code": -32603, "message": "session unavailable"}
		default:
			rpcErr = map[string]any{"code": -32601, "message": "Unknown method: " + req.Method}
		}
		resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
		if rpcErr != nil {
			resp["error"] = rpcErr
		} else {
			resp["result"] = result
		}
		raw, _ := json.Marshal(resp)
		if _, err := conn.Write(append(raw, '\n')); err != nil {
			return
		}
	}
}

// A chat whose connection is lost (the gateway died, the stack stopped)
// ends with the reason and how to resume, and a non-zero exit: it used to
// print "error: write ...: broken pipe" for every line that followed and
// exit 0, as if the script had run.
func TestChatEndsWhenTheConnectionIsLost(t *testing.T) {
	sock := fakeStack(t)
	var out strings.Builder
	err := chatCmd([]string{"--socket", sock}, strings.NewReader("/say one\n/say two\n/say three\n"), &out)
	if err == nil || !strings.Contains(err.Error(), "connection to the stack was lost") ||
		!strings.Contains(err.Error(), "clawmesh chat --session sess_new") {
		t.Fatalf("chat returned %v\noutput:\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "error:") {
		t.Fatalf("chat went on after the connection was lost:\n%s", out.String())
	}
}

// --session resumes a session; one that does not exist (a typo, one
// deleted) is refused and named, where session/new used to make a new,
// empty session under the mistyped id and chat went on in it.
func TestChatSessionMustExist(t *testing.T) {
	sock := fakeStack(t, "sess_known")
	var out strings.Builder
	err := chatCmd([]string{"--socket", sock, "--session", "sess_knwon"}, strings.NewReader("/quit\n"), &out)
	if err == nil || !strings.Contains(err.Error(), "sess_knwon") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("chat --session of no session: %v\noutput:\n%s", err, out.String())
	}
	if out.Len() != 0 {
		t.Fatalf("chat opened a session:\n%s", out.String())
	}
	out.Reset()
	if err := chatCmd([]string{"--socket", sock, "--session", "sess_known"}, strings.NewReader("/quit\n"), &out); err != nil ||
		!strings.HasPrefix(out.String(), "session sess_known ") {
		t.Fatalf("chat --session of a known session: %v\n%s", err, out.String())
	}
}

// call --timeout: a call the stack does not answer in time fails naming
// the method, the limit and the flag, where it said "waiting for response
// 2 to session/prompt: read unix @->...: i/o timeout (read \"\")"; a limit
// that is no limit (0, negative) is refused, where it meant 30 s unsaid.
func TestCallTimeoutSaid(t *testing.T) {
	sock := fakeStack(t)
	var out strings.Builder
	quiet := filepath.Join(t.TempDir(), "quiet.sock")
	ln, err := net.Listen("unix", quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveQuietAfterInit(c)
		}
	}()
	err = callCmd([]string{"--socket", quiet, "--timeout", "200ms", "session/prompt", `{"session_id":"s","prompt":"hi"}`}, &out)
	if err == nil || !strings.Contains(err.Error(), "session/prompt: no answer within 200ms (--timeout)") {
		t.Fatalf("call past its timeout: %v", err)
	}
	for _, d := range []string{"0", "-1s"} {
		err := callCmd([]string{"--socket", sock, "--timeout", d, "status"}, &out)
		if err == nil || !strings.Contains(err.Error(), "--timeout") {
			t.Errorf("call --timeout %s: %v", d, err)
		}
	}
}

// serveQuietAfterInit answers initialize and nothing after it.
func serveQuietAfterInit(conn net.Conn) {
	defer conn.Close()
	lines := bufio.NewScanner(conn)
	for lines.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(lines.Bytes(), &req) != nil {
			return
		}
		if req.Method == "initialize" {
			raw, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": map[string]any{}})
			if _, err := conn.Write(append(raw, '\n')); err != nil {
				return
			}
		}
	}
}

// A line of input past chat's 1 MiB ends chat saying so, where it said
// "bufio.Scanner: token too long".
func TestChatSaysALineIsTooLong(t *testing.T) {
	sock := fakeStack(t)
	var out strings.Builder
	err := chatCmd([]string{"--socket", sock}, strings.NewReader("/say "+strings.Repeat("a", 2<<20)+"\n"), &out)
	if err == nil || !strings.Contains(err.Error(), "longer than 1 MiB") {
		t.Fatalf("chat of a 2 MiB line: %v", err)
	}
}

// --agent with --session: a session keeps the agent it was made with, and
// chat went on with it without a word about the --agent it was given.
func TestChatSaysAgentOfAResumedSession(t *testing.T) {
	sock := fakeStack(t, "sess_known")
	var out strings.Builder
	if err := chatCmd([]string{"--socket", sock, "--session", "sess_known", "--agent", "other"}, strings.NewReader("/quit\n"), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--agent other is not used: session sess_known runs agent default") {
		t.Fatalf("chat --session --agent:\n%s", out.String())
	}
	out.Reset()
	if err := chatCmd([]string{"--socket", sock, "--session", "sess_known"}, strings.NewReader("/quit\n"), &out); err != nil || strings.Contains(out.String(), "not used") {
		t.Fatalf("chat --session alone: %v\n%s", err, out.String())
	}
}
