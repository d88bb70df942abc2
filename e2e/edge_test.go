package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// edgeRow is one frame in and its reply out, or silence, on the real
// gateway socket (docs/spec.md §2 and §4).
type edgeRow struct {
	name     string
	initDone bool // sent on an initialized connection
	in       string
	silent   bool
	wantID   string // raw JSON id of the reply
	wantCode int64  // 0: a result is expected
	wantMsg  string // when set, the exact error message
	wantData string // when set, the exact error data
	check    func(result json.RawMessage) error
}

var edgeRows = []edgeRow{
	// docs/spec.md §4: the handshake.
	{name: "status before initialize", in: `{"jsonrpc":"2.0","method":"status","params":{},"id":1}`,
		wantID: `1`, wantCode: -32010, wantMsg: "First call must be 'initialize'"},
	{name: "unknown method before initialize", in: `{"jsonrpc":"2.0","method":"no/such","id":2}`,
		wantID: `2`, wantCode: -32010, wantMsg: "First call must be 'initialize'"},
	{name: "notification before initialize", in: `{"jsonrpc":"2.0","method":"status"}`, silent: true},
	{name: "version mismatch", in: `{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":7},"id":3}`,
		wantID: `3`, wantCode: -32011, wantMsg: "Protocol version mismatch: server=1, client=7"},
	{name: "nothing bound after a mismatch", in: `{"jsonrpc":"2.0","method":"status","id":4}`, wantID: `4`, wantCode: -32010},
	{name: "version missing", in: `{"jsonrpc":"2.0","method":"initialize","params":{},"id":5}`,
		wantID: `5`, wantCode: -32602, wantMsg: "Invalid params: `protocol_version` is required"},
	{name: "version of the wrong type", in: `{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":"one"},"id":6}`,
		wantID: `6`, wantCode: -32602},
	{name: "unpaired token, no fallback to the operator", in: `{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":1,"auth_token":"nope"},"id":7}`,
		wantID: `7`, wantCode: -32010},
	{name: "nothing bound after a bad token", in: `{"jsonrpc":"2.0","method":"status","id":8}`, wantID: `8`, wantCode: -32010},
	{name: "initialize snake_case", in: `{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":1,"client_capabilities":{"elicitation":{}}},"id":9}`,
		wantID: `9`, check: checkInitialize},
	{name: "re-initialize camelCase", initDone: true, in: `{"jsonrpc":"2.0","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}},"id":"again"}`,
		wantID: `"again"`, check: checkInitialize},
	// docs/spec.md §2 on an initialized connection.
	{name: "unknown method", initDone: true, in: `{"jsonrpc":"2.0","method":"no/such","id":10}`,
		wantID: `10`, wantCode: -32601, wantMsg: "Unknown method: no/such"},
	{name: "params absent read as {}", initDone: true, in: `{"jsonrpc":"2.0","method":"status","id":11}`, wantID: `11`},
	{name: "CR and whitespace tolerated", initDone: true, in: "  " + `{"jsonrpc":"2.0","method":"health","id":12}` + " \r", wantID: `12`},
	{name: "invalid JSON", initDone: true, in: `{"jsonrpc":"2.0","method":`, wantID: `null`, wantCode: -32700},
	{name: "batch", initDone: true, in: `[{"jsonrpc":"2.0","method":"status","id":13}]`, wantID: `null`, wantCode: -32600},
	{name: "jsonrpc 1.0 request", initDone: true, in: `{"jsonrpc":"1.0","method":"status","id":14}`, wantID: `14`, wantCode: -32600},
	{name: "params a string", initDone: true, in: `{"jsonrpc":"2.0","method":"status","params":"x","id":15}`, wantID: `15`, wantCode: -32600},
	{name: "method not a string", initDone: true, in: `{"jsonrpc":"2.0","method":1,"id":16}`, wantID: `16`, wantCode: -32600},
	{name: "result and method", initDone: true, in: `{"jsonrpc":"2.0","method":"status","result":1,"id":17}`, wantID: `17`, wantCode: -32600},
	{name: "unrecoverable id", initDone: true, in: `{"jsonrpc":"2.0","method":"status","id":{"a":1}}`, wantID: `null`, wantCode: -32600},
	{name: "malformed response dropped", initDone: true, in: `{"jsonrpc":"2.0","id":"zc-out-0"}`, silent: true},
	{name: "response with both members dropped", initDone: true, in: `{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"x"}}`, silent: true},
	{name: "response with params dropped", initDone: true, in: `{"jsonrpc":"2.0","id":1,"result":1,"params":{}}`, silent: true},
	{name: "unknown response id ignored", initDone: true, in: `{"jsonrpc":"2.0","id":"zc-out-42","result":null}`, silent: true},
	{name: "notification never answered", initDone: true, in: `{"jsonrpc":"2.0","method":"status","params":{}}`, silent: true},
	{name: "unknown notification never answered", initDone: true, in: `{"jsonrpc":"2.0","method":"no/such"}`, silent: true},
}

func checkInitialize(raw json.RawMessage) error {
	var r struct {
		PV      int      `json:"protocol_version"`
		PVCamel int      `json:"protocolVersion"`
		SV      string   `json:"server_version"`
		SVCamel string   `json:"serverVersion"`
		PID     int      `json:"server_pid"`
		Caps    []string `json:"capabilities"`
		Prin    string   `json:"principal_id"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	if r.PV != 1 || r.PVCamel != 1 || r.SV == "" || r.SV != r.SVCamel || r.PID <= 0 || r.Prin != "shared-operator" {
		return fmt.Errorf("initialize result %s", raw)
	}
	for _, m := range []string{"initialize", "status", "health"} {
		if !contains(r.Caps, m) {
			return fmt.Errorf("capabilities %v lack %s", r.Caps, m)
		}
	}
	return nil
}

func TestEdgeBehaviourTable(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{})
	c := s.Dial(t)
	sentinel := 0
	for _, row := range edgeRows {
		t.Run(row.name, func(t *testing.T) {
			if err := c.Send(row.in); err != nil {
				t.Fatal(err)
			}
			if row.silent {
				// Silence: the next frame is the reply to a sentinel.
				sentinel++
				id := fmt.Sprintf(`"sentinel-%d"`, sentinel)
				if err := c.Send(`{"jsonrpc":"2.0","method":"status","id":` + id + `}`); err != nil {
					t.Fatal(err)
				}
				f, line, err := c.Read(10 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if string(f.ID) != id {
					t.Fatalf("expected silence, got %s", line)
				}
				return
			}
			f, line, err := c.Read(10 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if string(f.ID) != row.wantID {
				t.Fatalf("reply id %s, want %s: %s", f.ID, row.wantID, line)
			}
			if row.wantCode == 0 {
				if f.Error != nil || f.Result == nil {
					t.Fatalf("want a result: %s", line)
				}
				if row.check != nil {
					if err := row.check(f.Result); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
			if f.Error == nil || f.Error.Code != row.wantCode {
				t.Fatalf("want error %d: %s", row.wantCode, line)
			}
			if row.wantMsg != "" && f.Error.Message != row.wantMsg {
				t.Fatalf("message %q, want %q", f.Error.Message, row.wantMsg)
			}
			if row.wantData != "" && string(f.Error.Data) != row.wantData {
				t.Fatalf("data %s, want %s", f.Error.Data, row.wantData)
			}
		})
	}
}

// The limits of docs/spec.md §3, set short with --set, each with its exact reply
// and the end of the stream.
func TestEdgeLimits(t *testing.T) {
	t.Parallel()
	s := e2e.Start(t, e2e.Options{Args: []string{
		"--set", "rpc.max_frame_bytes=1024",
		"--set", "rpc.frame_timeout_ms=300",
		"--set", "rpc.initialize_timeout_ms=700",
		"--set", "rpc.write_stall_timeout_ms=500",
		"--set", "rpc.max_local_connections=4",
	}})

	t.Run("frame too large", func(t *testing.T) {
		conn := rawDial(t, s.Socket)
		// 4 KiB without a newline: the cap is 1 KiB.
		if _, err := conn.Write([]byte(`{"jsonrpc":"2.0","method":"status","params":{"pad":"` + strings.Repeat("x", 4096))); err != nil {
			t.Fatal(err)
		}
		expectErrorThenEOF(t, conn, -32600, `{"reason":"frame_too_large","limit_bytes":1024}`)
	})
	t.Run("unfinished frame", func(t *testing.T) {
		conn := rawDial(t, s.Socket)
		initialize(t, conn)
		if _, err := conn.Write([]byte(`{"jsonrpc":"2.0",`)); err != nil {
			t.Fatal(err)
		}
		expectErrorThenEOF(t, conn, -32600, `{"reason":"frame_timeout","limit_ms":300}`)
	})
	t.Run("idle between frames is unbounded", func(t *testing.T) {
		c := s.Dial(t)
		if _, err := c.Initialize(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1200 * time.Millisecond) // past every deadline above
		if _, err := c.Call("status", nil); err != nil {
			t.Fatalf("an idle initialized client was cut: %v", err)
		}
	})
	t.Run("silent client past the initialize deadline", func(t *testing.T) {
		conn := rawDial(t, s.Socket)
		start := time.Now()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(conn)
		if err != nil || len(b) != 0 {
			t.Fatalf("want a close with no reply, got %q %v", b, err)
		}
		// Not before the deadline (700 ms): the close is the deadline's.
		if took := time.Since(start); took < 600*time.Millisecond {
			t.Fatalf("closed after %v, before the initialize deadline", took)
		}
	})
	t.Run("a reader that stalls is cut, another keeps working", func(t *testing.T) {
		stalled := rawDial(t, s.Socket)
		initialize(t, stalled)
		other := s.Dial(t)
		if _, err := other.Initialize(); err != nil {
			t.Fatal(err)
		}
		// Pipeline requests and never read: the replies fill the socket
		// buffers and the gateway's writer stalls.
		go func() {
			req := []byte(strings.Repeat(`{"jsonrpc":"2.0","method":"health","id":1}`+"\n", 200))
			for range 200 {
				if _, err := stalled.Write(req); err != nil {
					return
				}
			}
		}()
		testenv.Eventually(t, 20*time.Second, 50*time.Millisecond, func() error {
			if _, err := other.Call("status", nil); err != nil {
				return fmt.Errorf("the other client failed: %w", err)
			}
			if !strings.Contains(readLog(t, s, "gateway"), "write stalled") {
				return errors.New("no write stall yet")
			}
			return nil
		})
		// The stalled connection ends: reading now drains then sees EOF.
		stalled.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, stalled); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("stalled connection not closed: %v", err)
		}
		if _, err := other.Call("status", nil); err != nil {
			t.Fatalf("the other client after the cut: %v", err)
		}
	})
	t.Run("connection ceiling", func(t *testing.T) {
		var held []*e2e.Client
		testenv.Eventually(t, 10*time.Second, 50*time.Millisecond, func() error {
			// Earlier subtests' connections may still be closing.
			for len(held) < 4 {
				c, err := e2e.Dial(s.Socket)
				if err != nil {
					return err
				}
				if _, err := c.Initialize(); err != nil {
					c.Close()
					return err
				}
				held = append(held, c)
			}
			return nil
		})
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		conn := rawDial(t, s.Socket)
		expectErrorThenEOF(t, conn, -32004, `{"reason":"connection_limit","limit":4}`)
		// The held ones still work.
		if _, err := held[0].Call("status", nil); err != nil {
			t.Fatal(err)
		}
	})
}

func rawDial(t *testing.T, path string) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func initialize(t *testing.T, conn net.Conn) {
	t.Helper()
	if _, err := conn.Write([]byte(`{"jsonrpc":"2.0","method":"initialize","params":{"protocol_version":1},"id":"init"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := conn.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), `"id":"init"`) || !strings.Contains(string(buf[:n]), "result") {
		t.Fatalf("initialize: %q %v", buf[:n], err)
	}
}

// expectErrorThenEOF reads everything until the server closes: exactly one
// error frame with id null, the code and data given.
func expectErrorThenEOF(t *testing.T, conn net.Conn, code int64, data string) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, err := io.ReadAll(conn)
	// A close with our unread bytes still in its buffer reaches us as a
	// reset: the server never read the rest, which is the point.
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("want the stream to end after the error, got %v (read %q)", err, all)
	}
	lines := strings.Split(strings.TrimRight(string(all), "\n"), "\n")
	if len(lines) != 1 {
		t.Fatalf("want exactly one frame, got %q", all)
	}
	var f e2e.Frame
	if err := json.Unmarshal([]byte(lines[0]), &f); err != nil {
		t.Fatal(err)
	}
	if string(f.ID) != "null" || f.Error == nil || f.Error.Code != code || string(f.Error.Data) != data {
		t.Fatalf("got %s, want code %d data %s id null", lines[0], code, data)
	}
}

func readLog(t *testing.T, s *e2e.Stack, process string) string {
	t.Helper()
	b, _ := os.ReadFile(s.DataDir + "/logs/" + process + ".log")
	return string(b)
}
