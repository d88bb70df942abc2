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
	"github.com/clawmesh/clawmesh/internal/listenfd"
	"github.com/clawmesh/clawmesh/internal/unixsock"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// DurableBridge may sleep (see dormant): it serves Collie alone,
// and a stack no Collie has used has nothing for it to do (measured: an
// idle bridge holds 11 MB resident).
const DurableBridge = "durable-bridge"

// UploadStaging sleeps too: it serves the gateway's file methods alone,
// and a stack nobody has sent a file to has nothing staged (measured: an
// idle upload-staging holds 8.8 MB resident).
const UploadStaging = "upload-staging"

// dormant holds the socket of a process the launcher has not started
// (its clients' socket for the durable bridge, its gRPC socket for
// upload-staging). The first client connection wakes it: the launcher
// starts the process and hands it the socket, and the connection,
// waiting in the socket's backlog, is served. The launcher keeps the
// socket for the process's later runs too, so a client connecting during
// a restart waits instead of being refused. While it sleeps the marker
// datadir.Dormant says so to the gateway, which shows it "dormant".
type dormant struct {
	name    string // the process
	fdName  string // the name it is passed the socket under (listenfd)
	log     *zap.Logger
	dataDir string
	path    string
	ln      *net.UnixListener
	file    *os.File // the descriptor each run of the process is given
	// woke runs once the process has started (nil: nothing to do).
	woke func()

	// The watch's stop pipe.
	stopR, stopW int
	closeOnce    sync.Once

	mu     sync.Mutex
	handed bool // the socket goes to the process (else it listens itself)
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
		return nil, clearDormant(dataDir, DurableBridge)
	}
	if _, err := os.Stat(datadir.DurableWoken(dataDir)); err == nil {
		return nil, clearDormant(dataDir, DurableBridge)
	}
	path := durablesock.DefaultSocket(dataDir)
	ln, err := durablesock.ListenSocket(path)
	if err != nil {
		// The bridge may be configured to listen elsewhere
		// (durable.socket_path), which the launcher cannot know yet:
		// it starts with the others and says itself what is wrong.
		log.Warn("durable socket not held; the bridge starts with the stack", zap.String("socket", path), zap.Error(err))
		return nil, clearDormant(dataDir, DurableBridge)
	}
	// A gRPC socket left by an earlier run would be dialled by whoever
	// looks for the bridge there; it belongs to a bridge that runs.
	_ = os.Remove(datadir.ServiceSocket(dataDir, DurableBridge, 0))
	d, err := hold(dataDir, DurableBridge, listenfd.DurableSocket, path, ln, log)
	if err != nil {
		return nil, fmt.Errorf("durable socket: %w", err)
	}
	d.woke = func() {
		if err := os.WriteFile(datadir.DurableWoken(dataDir), nil, 0o600); err != nil {
			log.Warn("durable bridge not marked as woken; it sleeps again at the next start", zap.Error(err))
		}
	}
	return d, nil
}

// holdStaging makes upload-staging sleep until its first client (the
// gateway's first file method, or an operator's grpcurl) connects to its
// gRPC socket, on every start: it keeps nothing across runs. A socket
// that cannot be held is no reason to stop: it then starts with the
// others and listens itself (and says what is wrong).
func holdStaging(dataDir string, log *zap.Logger) (*dormant, error) {
	path := datadir.ServiceSocket(dataDir, UploadStaging, 0)
	ln, err := unixsock.Listen(path)
	if err != nil {
		log.Warn("upload-staging socket not held; it starts with the stack", zap.String("socket", path), zap.Error(err))
		return nil, clearDormant(dataDir, UploadStaging)
	}
	d, err := hold(dataDir, UploadStaging, listenfd.GRPCSocket, path, ln, log)
	if err != nil {
		return nil, fmt.Errorf("upload-staging socket: %w", err)
	}
	return d, nil
}

// hold makes the dormant of process name on ln, listening at path, and
// marks it dormant for the gateway.
func hold(dataDir, name, fdName, path string, ln net.Listener, log *zap.Logger) (*dormant, error) {
	uln, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, fmt.Errorf("%s is not a Unix socket", path)
	}
	file, err := uln.File()
	if err != nil {
		ln.Close()
		return nil, err
	}
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		file.Close()
		ln.Close()
		return nil, fmt.Errorf("watch: %w", err)
	}
	if err := os.WriteFile(datadir.Dormant(dataDir, name), nil, 0o600); err != nil {
		file.Close()
		ln.Close()
		unix.Close(pipe[0])
		unix.Close(pipe[1])
		return nil, fmt.Errorf("dormant marker: %w", err)
	}
	return &dormant{name: name, fdName: fdName, log: log, dataDir: dataDir, path: path, ln: uln, file: file,
		handed: true, stopR: pipe[0], stopW: pipe[1]}, nil
}

// clearDormant removes a dormant marker an earlier launcher left (it died
// before removing it): the process starts with the stack this time.
func clearDormant(dataDir, name string) error {
	if err := os.Remove(datadir.Dormant(dataDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: stale dormant marker: %w", name, err)
	}
	return nil
}

// passed returns the socket to pass to a run of the process, or nil.
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

// watch wakes the process, with start, when a client connects to its
// socket, on a goroutine the dormant owns until close. start runs at most
// once.
func (d *dormant) watch(start func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.waitClient(); err != nil {
			if !errors.Is(err, errStopWatch) {
				d.log.Warn("socket not watched; the process starts now", zap.String("process", d.name), zap.Error(err))
				d.wake(true, "the socket could not be watched", start)
			}
			return
		}
		d.wake(true, "a client connected", start)
	}()
}

// wakeSoon wakes the process at once, on a goroutine the dormant owns
// until close: the stack's start does not wait for it.
func (d *dormant) wakeSoon(handOver bool, why string, start func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.wake(handOver, why, start)
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
				werr = fmt.Errorf("%s: poll events %#x", d.path, fds[0].Revents)
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

// wake starts the process once. handOver false closes the held socket
// first: the process listens where its config says. Once start returns
// (the process serves, or could not be started), the dormant marker goes
// if start has not removed it (the launcher's does once the process
// answers its health check): the gateway then shows the process as it
// is.
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
	d.log.Info("waking a dormant process", zap.String("process", d.name), zap.String("why", why))
	err := start()
	if rerr := clearDormant(d.dataDir, d.name); rerr != nil {
		d.log.Warn("dormant marker left", zap.Error(rerr))
	}
	if err != nil {
		if !errors.Is(err, errStopping) {
			d.log.Error("dormant process not started; its socket is closed", zap.String("process", d.name), zap.Error(err))
		}
		// A client waiting in the backlog is refused now, rather than
		// left waiting for a process that will not come. (Not release:
		// this may run on the watch, which release waits for.)
		d.drop()
		return
	}
	if d.woke != nil {
		d.woke()
	}
}

// close stops the watch and waits for it; the held socket is closed (and
// its file removed) by release, after the process has stopped.
func (d *dormant) close() {
	d.closeOnce.Do(func() {
		_, _ = unix.Write(d.stopW, []byte{0})
		d.wg.Wait()
		unix.Close(d.stopR)
		unix.Close(d.stopW)
	})
}

// release closes the held socket and removes the marker; called once
// every process has stopped.
func (d *dormant) release() {
	d.close() // when the start failed before the watch's stopper was set
	d.drop()
	if err := clearDormant(d.dataDir, d.name); err != nil {
		d.log.Warn("dormant marker left", zap.Error(err))
	}
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
