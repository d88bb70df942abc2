package gateway

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/filepass"
)

// A connection's upload chunks are decoded into a scratch memfd of its
// own (internal/filepass), passed once to upload-staging's scratch socket
// and named by each Chunk call after, so that a chunk's megabyte does not
// cross the gRPC hop (docs/performance.md, sixty-fifth round). A
// connection has two, for two chunks in flight at once (sixty-sixth
// round). Where there is none, or both are in use by others of the
// connection's chunks, or the pass was refused, the bytes go in the
// message as before. upload-staging holds a scratch for as long as the
// connection it was passed over is open: its close here (a retirement,
// the client connection's end) or this process's end drops it there.
//
// Whether the hand-over can work at all is read from upload-staging's
// address: a Unix socket path (the launcher's stack, one host) has a
// scratch socket beside it; a host:port (compose with separate
// containers, another host) has none, and nothing is tried. A path whose
// scratch socket is missing or refuses (another user, a container that
// does not share the folder, an upload-staging without scratches) fails
// the pass, and the connection sends bytes for scratchRetry.

// scratchRetry is how long a connection whose pass was refused sends its
// chunks' bytes before it tries a pass again.
const scratchRetry = 10 * time.Second

// scratch is a passed scratch memfd and the token upload-staging holds it
// under for this gateway and connection.
type scratch struct {
	mem   *filepass.Scratch
	token string
}

// scratchesPerConn is how many scratches a connection has at most: two
// chunks in flight at once (a client pipelining its chunks, or two
// uploads' at a time) each decode into one of their own, and a third
// goes in its message. It is upload-staging's bound a connection
// (filepass.MaxScratchesPerConn), which a connection's scratches, and the
// retired ones its next passes replace, never pass.
const scratchesPerConn = filepass.MaxScratchesPerConn

// connScratch is a connection's scratches: at most scratchesPerConn
// mapped here, each used by one chunk at a time, from its decoding until
// its call answered.
type connScratch struct {
	mu sync.Mutex
	// free are the scratches passed and not in use.
	free []*scratch
	// n counts the connection's scratches: free, in use, being passed.
	n int
	// retired are the tokens of scratches retired and not yet replaced:
	// each next pass names one, so upload-staging drops it then, before
	// the connection's bound is counted (its close of the pass's
	// connection drops it as well, a moment later).
	retired []string
	// refusedUntil: a pass was refused; none is tried before it.
	refusedUntil time.Time
	closed       bool
}

// takeScratch returns a free scratch of the connection, passed first if
// all it has are in use and it may have another, marked in use until
// release; nil when the chunk's bytes go in the message.
func (g *Gateway) takeScratch(ctx context.Context, cs *connState) *scratch {
	if g.scratchPath == "" {
		return nil
	}
	c := &cs.scratch
	c.mu.Lock()
	if c.closed || time.Now().Before(c.refusedUntil) {
		c.mu.Unlock()
		return nil
	}
	if k := len(c.free); k > 0 {
		sc := c.free[k-1]
		c.free = c.free[:k-1]
		c.mu.Unlock()
		return sc
	}
	if c.n >= scratchesPerConn {
		c.mu.Unlock()
		return nil
	}
	c.n++
	var replaces string
	if k := len(c.retired); k > 0 {
		replaces = c.retired[k-1]
		c.retired = c.retired[:k-1]
	}
	c.mu.Unlock()

	sc, err := passScratch(ctx, g.scratchPath, filepass.ScratchBinding{Gateway: g.id, Conn: cs.id}, replaces)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.n--
		if replaces != "" {
			c.retired = append(c.retired, replaces)
		}
		c.refusedUntil = time.Now().Add(scratchRetry)
		g.log.Debug("upload scratch not passed, chunks are sent in messages", zap.String("conn", cs.id), zap.Error(err))
		return nil
	}
	if c.closed {
		c.n--
		_ = sc.mem.Close()
		return nil
	}
	return sc
}

// passScratch makes a scratch and passes it to path.
func passScratch(ctx context.Context, path string, bind filepass.ScratchBinding, replaces string) (*scratch, error) {
	mem, err := filepass.NewScratch()
	if err != nil {
		return nil, err
	}
	tok, err := filepass.PassScratch(ctx, path, mem, bind, replaces)
	if err != nil {
		_ = mem.Close()
		return nil, err
	}
	return &scratch{mem: mem, token: tok}, nil
}

// release ends sc's use by a chunk (nil: none). retire drops it: after a
// failed call upload-staging may still be reading it, so it is never
// written again; this process unmaps it and a later chunk takes a new
// one.
func (c *connScratch) release(sc *scratch, retire bool) {
	if sc == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !retire && !c.closed {
		c.free = append(c.free, sc)
		return
	}
	c.n--
	if retire {
		c.retired = append(c.retired, sc.token)
	}
	_ = sc.mem.Close()
}

// close drops the connection's scratches once no chunk uses them (those
// in use go at their release); closing each closes the connection it was
// passed over, and upload-staging drops it.
func (c *connScratch) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, sc := range c.free {
		_ = sc.mem.Close()
	}
	c.n -= len(c.free)
	c.free = nil
}
