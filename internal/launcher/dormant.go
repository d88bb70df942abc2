package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/internal/durablesock"
	"github.com/clawmesh/clawmesh/internal/grpcclient"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// DurableBridge is the process that may sleep: it serves Collie alone,
// and a stack no Collie has used has nothing for it to do (measured: an
// idle bridge holds 11 MB resident).
const DurableBridge = "durable-bridge"

// dormant holds the durable bridge's private socket while the bridge is
// not started. The first client connection wakes it: the launcher starts
// the bridge and hands it the socket, and the connection, waiting in the
// socket's backlog, is served. The launcher keeps the socket for the
// bridge's later runs too, so a client connecting during a restart waits
// instead of being refused.
type dormant struct {
	log     *zap.Logger
	dataDir string
	path    string
	ln      *net.UnixListener
	file    *os.File // the descriptor each run of the bridge is given

	// The watch's stop pipe.
	stopR, stopW int
	closeOnce    sync.Once

	mu     sync.Mutex
	handed bool // the socket goes to the bridge (else it listens itself)
	woken  bool
	wg     sync.WaitGroup
}

// holdDurable decides whether the durable bridge sleeps: it does unless
// it has run on this data directory before or its socket is put
// elsewhere (COLLIE_DURABLE_SOCKET), or the default path cannot be held.
// When it sleeps, the launcher listens on its socket; a nil dormant means
// the bridge starts with the others.
//
// A durable.socket_path set while the stack runs takes effect at the
// bridge's next run, which listens there and closes the socket it was
// handed; the launcher keeps holding the default path until the stack
// stops (a client there waits unanswered), and the next stack, the
// bridge having run, does not hold it.
func holdDurable(dataDir string, log *zap.Logger) (*dormant, error) {
	if os.Getenv(durablesock.EnvSocket) != "" {
		return nil, nil
	}
	if _, err := os.Stat(datadir.DurableWoken(dataDir)); err == nil {
		return nil, nil
	}
	path := durablesock.DefaultSocket(dataDir)
	ln, err := durablesock.ListenSocket(path)
	if err != nil {
		// The bridge may be configured to listen elsewhere
		// (durable.socket_path), which the launcher cannot know yet:
		// it starts with the others and says itself what is wrong.
		log.Warn("durable socket not held; the bridge starts with the stack", zap.String("socket", path), zap.Error(err))
		return nil, nil
	}
	uln := ln.(*net.UnixListener)
	file, err := uln.File()
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("durable socket: %w", err)
	}
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		file.Close()
		ln.Close()
		return nil, fmt.Errorf("durable socket watch: %w", err)
	}
	// A gRPC socket left by an earlier run would show the sleeping
	// bridge as unreachable rather than dormant (the gateway tells them
	// apart by the socket's presence).
	_ = os.Remove(datadir.ServiceSocket(dataDir, DurableBridge, 0))
	return &dormant{log: log, dataDir: dataDir, path: path, ln: uln, file: file, handed: true,
		stopR: pipe[0], stopW: pipe[1]}, nil
}

// passed returns the socket to pass to a run of the bridge, or nil.
func (d *dormant) passed() *os.File {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.handed {
		return nil
	}
	return d.file
}

// configured reports whether the config asks for what only the bridge
// itself can set up: a socket at another path (durable.socket_path) or
// the token transport (durable.listen_url). Either wakes it at once,
// without the held socket.
func configured(ctx context.Context, configSocket string) (bool, error) {
	cc, err := grpcclient.Dial(configSocket)
	if err != nil {
		return false, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	live, err := configv1.NewConfigServiceClient(cc).Live(ctx, &configv1.LiveRequest{})
	if err != nil {
		return false, err
	}
	d := configclient.Snapshot{Revision: live.GetRevision(), Document: live.GetDocument().AsMap()}.Durable()
	return d.SocketPath != "" || d.ListenURL != "", nil
}

// watch wakes the bridge, with start, when a client connects to its
// socket, on a goroutine the dormant owns until close. start runs at most
// once.
func (d *dormant) watch(start func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.waitClient(); err != nil {
			if !errors.Is(err, errStopWatch) {
				d.log.Warn("durable socket not watched; the bridge starts now", zap.Error(err))
				d.wake(true, "the socket could not be watched", start)
			}
			return
		}
		d.wake(true, "a client connected", start)
	}()
}

// waitClient returns nil once a connection waits in the socket's backlog
// (without accepting it), errStopWatch after close, or the error that
// ended the wait. A listener's descriptor cannot be waited on through
// Go's poller (a listener's RawConn reads nothing), so this goroutine
// waits in poll(2) on it and on a pipe that close writes to.
func (d *dormant) waitClient() error {
	rc, err := d.ln.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(d.stopR), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			switch {
			case err == unix.EINTR:
				continue
			case err != nil:
				werr = err
			case fds[1].Revents != 0:
				werr = errStopWatch
			case fds[0].Revents&unix.POLLIN == 0:
				werr = fmt.Errorf("durable socket: poll events %#x", fds[0].Revents)
			}
			return
		}
	}); err != nil {
		return err
	}
	return werr
}

// errStopWatch ends a watch at close.
var errStopWatch = errors.New("watch stopped")

// wake starts the bridge once. handOver false closes the held socket
// first: the bridge listens where its config says. The data directory is
// marked so that the bridge starts with the stack from now on.
func (d *dormant) wake(handOver bool, why string, start func() error) {
	d.mu.Lock()
	if d.woken {
		d.mu.Unlock()
		return
	}
	d.woken = true
	d.mu.Unlock()
	if !handOver {
		d.drop()
	}
	d.log.Info("waking the durable bridge", zap.String("why", why))
	if err := start(); err != nil {
		if !errors.Is(err, errStopping) {
			d.log.Error("durable bridge not started; its socket is closed", zap.Error(err))
		}
		// A client waiting in the backlog is refused now, rather than
		// left waiting for a bridge that will not come. (Not release:
		// this may run on the watch, which release waits for.)
		d.drop()
		return
	}
	if err := os.WriteFile(datadir.DurableWoken(d.dataDir), nil, 0o600); err != nil {
		d.log.Warn("durable bridge not marked as woken; it sleeps again at the next start", zap.Error(err))
	}
}

// close stops the watch and waits for it; the held socket is closed (and
// its file removed) by release, after the bridge has stopped.
func (d *dormant) close() {
	d.closeOnce.Do(func() {
		_, _ = unix.Write(d.stopW, []byte{0})
		d.wg.Wait()
		unix.Close(d.stopR)
		unix.Close(d.stopW)
	})
}

// release closes the held socket; called once every process has stopped.
func (d *dormant) release() {
	d.close() // when the start failed before the watch's stopper was set
	d.drop()
}

// drop closes the held socket (removing its file), once.
func (d *dormant) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.handed {
		d.ln.Close()
		d.file.Close()
		d.handed = false
	}
}
