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
// cross the gRPC hop (docs/performance.md, sixty-fifth round). Where
// there is no scratch, or it is busy with another of the connection's
// chunks, or the pass was refused, the bytes go in the message as before.
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

// connScratch is a connection's scratch: at most one mapped here, used by
// one chunk at a time.
type connScratch struct {
	mu   sync.Mutex
	cur  *scratch
	busy bool
	// retired is the token of the scratch last retired, which the next
	// pass replaces, so upload-staging drops it then.
	retired string
	// refusedUntil: a pass was refused; none is tried before it.
	refusedUntil time.Time
	closed       bool
}

// takeScratch returns the connection's scratch, passed first if it has
// none, marked busy until release; nil when the chunk's bytes go in the
// message.
func (g *Gateway) takeScratch(ctx context.Context, cs *connState) *scratch {
	if g.scratchPath == "" {
		return nil
	}
	c := &cs.scratch
	c.mu.Lock()
	if c.busy || c.closed || time.Now().Before(c.refusedUntil) {
		c.mu.Unlock()
		return nil
	}
	c.busy = true
	if c.cur != nil {
		defer c.mu.Unlock()
		return c.cur
	}
	retired := c.retired
	c.mu.Unlock()

	sc, err := passScratch(ctx, g.scratchPath, filepass.ScratchBinding{Gateway: g.id, Conn: cs.id}, retired)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.busy = false
		c.refusedUntil = time.Now().Add(scratchRetry)
		g.log.Debug("upload scratch not passed, chunks are sent in messages", zap.String("conn", cs.id), zap.Error(err))
		return nil
	}
	if c.closed {
		c.busy = false
		_ = sc.mem.Close()
		return nil
	}
	c.cur, c.retired = sc, ""
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
// written again; this process unmaps it and the next chunk takes a new
// one.
func (c *connScratch) release(sc *scratch, retire bool) {
	if sc == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busy = false
	if retire || c.closed {
		if c.cur == sc {
			c.cur = nil
		}
		if retire {
			c.retired = sc.token
		}
		_ = sc.mem.Close()
	}
}

// close drops the connection's scratch once no chunk uses it; its
// discard (discardUploads) drops upload-staging's hold.
func (c *connScratch) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.cur != nil && !c.busy {
		_ = c.cur.mem.Close()
		c.cur = nil
	}
}
