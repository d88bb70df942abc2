// Package rpcclient is the one NDJSON JSON-RPC client of the project, for
// the CLI and the tests: it writes frames and reads lines on the client
// socket, as zerocode or socat would.
package rpcclient

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"
)

// Client is a minimal NDJSON JSON-RPC client. One goroutine uses it at a
// time: Call sends a request and reads until its response.
type Client struct {
	conn net.Conn
	r    *bufio.Reader
	mu   sync.Mutex
	wmu  sync.Mutex
	next int
	// Timeout bounds Call's wait for its response (default 30 s).
	Timeout time.Duration
	// OnFrame, when set, receives the frames Call reads that are not its
	// response (notifications, the daemon's own requests), in order;
	// otherwise notifications are kept in Notifications and requests
	// dropped.
	OnFrame func(f *Frame, raw []byte)
	// Notifications received while waiting for responses, in order.
	Notifications []json.RawMessage
}

// RPCError is an error object from the server.
type RPCError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("rpc error %d: %s", e.Code, e.Message) }

// Describe is the error as a person reads it: the message, then the code
// and data.
func (e *RPCError) Describe() string {
	if len(e.Data) > 0 {
		return fmt.Sprintf("%s (%d, %s)", e.Message, e.Code, e.Data)
	}
	return fmt.Sprintf("%s (%d)", e.Message, e.Code)
}

// Frame is any incoming frame.
type Frame struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

// Dial connects to a socket.
func Dial(path string) (*Client, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	return New(conn), nil
}

// New is a client on a connection already made.
func New(conn net.Conn) *Client {
	return &Client{conn: conn, r: bufio.NewReaderSize(conn, 1<<20), next: 1}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Send writes one raw line (LF added). It may be called from another
// goroutine than the one reading (to cancel a turn, say).
func (c *Client) Send(line string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := c.conn.Write([]byte(line + "\n"))
	return err
}

// Notify sends a notification (no id: never answered).
func (c *Client) Notify(method string, params any) error {
	raw, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	if err != nil {
		return err
	}
	return c.Send(string(raw))
}

// Reply answers a request the daemon sent (an elicitation/create, say).
func (c *Client) Reply(id json.RawMessage, result any) error {
	raw, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
	if err != nil {
		return err
	}
	return c.Send(string(raw))
}

// ReadLine reads the next line as it came, without its LF and not
// decoded, waiting at most d. The line is valid until the next read: a
// reader that looks for a few bytes (a benchmark's stamp) pays neither a
// copy nor a JSON decoding per frame.
func (c *Client) ReadLine(d time.Duration) ([]byte, error) {
	c.conn.SetReadDeadline(time.Now().Add(d))
	line, err := c.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		rest, e := c.r.ReadBytes('\n')
		line, err = append(append([]byte(nil), line...), rest...), e
	}
	if err != nil {
		return line, err
	}
	return line[:len(line)-1], nil
}

// Read reads the next frame, waiting at most d.
func (c *Client) Read(d time.Duration) (*Frame, []byte, error) {
	c.conn.SetReadDeadline(time.Now().Add(d))
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return nil, line, err
	}
	var f Frame
	if err := json.Unmarshal(line, &f); err != nil {
		return nil, line, fmt.Errorf("bad frame %q: %w", line, err)
	}
	return &f, line, nil
}

// Call sends a request and waits (up to Timeout) for its response,
// handing what arrives meanwhile to OnFrame or keeping notifications.
func (c *Client) Call(method string, params any) (json.RawMessage, error) {
	c.mu.Lock()
	id := c.next
	c.next++
	c.mu.Unlock()
	frame := map[string]any{"jsonrpc": "2.0", "id": id, "method": method}
	if params != nil {
		frame["params"] = params
	}
	raw, err := json.Marshal(frame)
	if err != nil {
		return nil, err
	}
	if err := c.Send(string(raw)); err != nil {
		return nil, err
	}
	want := fmt.Sprint(id)
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for {
		f, line, err := c.Read(time.Until(deadline))
		if err != nil {
			return nil, fmt.Errorf("waiting for response %d to %s: %w (read %q)", id, method, err, line)
		}
		if f.Method != "" {
			if c.OnFrame != nil {
				c.OnFrame(f, line)
			} else if len(f.ID) == 0 {
				c.Notifications = append(c.Notifications, json.RawMessage(line))
			}
			continue
		}
		if string(f.ID) != want {
			return nil, fmt.Errorf("response id %s, want %s: %s", f.ID, want, line)
		}
		if f.Error != nil {
			return nil, f.Error
		}
		return f.Result, nil
	}
}

// Initialize runs the handshake with protocol version 1, with a paired
// token when one is given.
func (c *Client) Initialize(token ...string) (map[string]any, error) {
	params := map[string]any{"protocolVersion": 1}
	if len(token) > 0 && token[0] != "" {
		params["auth_token"] = token[0]
	}
	raw, err := c.Call("initialize", params)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, json.Unmarshal(raw, &out)
}
