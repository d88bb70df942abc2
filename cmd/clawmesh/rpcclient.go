package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/clawmesh/clawmesh/internal/datadir"
)

// socketFlags are the flags of the commands that talk to the running
// stack over its client socket.
type socketFlags struct {
	dir, socket, token string
}

func (f *socketFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "config-dir", "", "data directory (env ZEROCLAW_CONFIG_DIR, ZEROCLAW_DATA_DIR; default ~/.zeroclaw/data)")
	fs.StringVar(&f.socket, "socket", "", "client socket (env ZEROCLAW_SOCKET; default <data>/daemon.sock)")
	fs.StringVar(&f.token, "token", os.Getenv("ZEROCLAW_TOKEN"), "paired auth_token to initialize with (env ZEROCLAW_TOKEN); none for the operator")
}

// dial connects to the stack's socket and initializes.
func (f *socketFlags) dial() (*rpcClient, error) {
	path := f.socket
	if path == "" {
		dir, err := datadir.Resolve(f.dir)
		if err != nil {
			return nil, err
		}
		path = datadir.Socket(dir)
	}
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("is the stack running? %w", err)
	}
	c := &rpcClient{conn: conn, r: bufio.NewReaderSize(conn, 1<<20)}
	params := map[string]any{"protocol_version": 1}
	if f.token != "" {
		params["auth_token"] = f.token
	}
	if _, err := c.call("initialize", params); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// rpcClient is a sequential NDJSON JSON-RPC client: one request at a
// time, notifications skipped.
type rpcClient struct {
	conn net.Conn
	r    *bufio.Reader
	next int
}

// rpcError is an error object from the daemon.
type rpcError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *rpcError) Error() string {
	if len(e.Data) > 0 {
		return fmt.Sprintf("%s (%d, %s)", e.Message, e.Code, e.Data)
	}
	return fmt.Sprintf("%s (%d)", e.Message, e.Code)
}

func (c *rpcClient) Close() error { return c.conn.Close() }

func (c *rpcClient) call(method string, params any) (json.RawMessage, error) {
	c.next++
	line, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.next, "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	_ = c.conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.conn.Write(append(line, '\n')); err != nil {
		return nil, err
	}
	for {
		raw, err := c.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
		var f struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Result json.RawMessage `json:"result"`
			Error  *rpcError       `json:"error"`
		}
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, fmt.Errorf("%s: bad frame: %w", method, err)
		}
		if f.Method != "" {
			continue // a notification or a request from the daemon: not ours
		}
		if string(f.ID) != fmt.Sprint(c.next) {
			return nil, errors.New(method + ": response to another request")
		}
		if f.Error != nil {
			return nil, f.Error
		}
		return f.Result, nil
	}
}
