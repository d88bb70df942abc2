// Package datadir resolves the data directory and the paths of everything
// a local stack keeps in it, so the launcher, the services and the CLI
// agree on where each socket lives.
package datadir

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Resolve picks the data directory: the flag value, then
// ZEROCLAW_CONFIG_DIR, then ZEROCLAW_DATA_DIR, then ~/.zeroclaw/data. The
// result is absolute.
func Resolve(flagValue string) (string, error) {
	dir := flagValue
	for _, env := range []string{"ZEROCLAW_CONFIG_DIR", "ZEROCLAW_DATA_DIR"} {
		if dir == "" {
			dir = os.Getenv(env)
		}
	}
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("home directory: %w", err)
		}
		dir = filepath.Join(home, ".zeroclaw", "data")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	return abs, nil
}

// Socket is the client socket: ZEROCLAW_SOCKET, else <dir>/daemon.sock.
func Socket(dir string) string {
	if s := os.Getenv("ZEROCLAW_SOCKET"); s != "" {
		return s
	}
	return filepath.Join(dir, "daemon.sock")
}

// ServiceSocket is the gRPC socket of a service replica: replica 0 is
// <dir>/<service>.sock, replica i>0 is <dir>/<service>.<i>.sock.
func ServiceSocket(dir, service string, replica int) string {
	if replica == 0 {
		return filepath.Join(dir, service+".sock")
	}
	return filepath.Join(dir, service+"."+strconv.Itoa(replica)+".sock")
}

// Memories is where the plugin sandbox keeps its memory plugins'
// journals, one folder shared by every replica (a replica that starts, or
// another that serves the next call, reads what the others wrote):
// deployments mount it from storage the replicas share.
func Memories(dir string) string { return filepath.Join(dir, "memories") }

// ChannelSpool holds the channels' accepted messages until each is done
// with, a folder per alias and replica process.
func ChannelSpool(dir string) string { return filepath.Join(dir, "channel-spool") }

// MemoryJournal is the journal of the memory plugin named plugin in the
// folder memories (Memories). A rewrite writes its new file beside it,
// named as the journal followed by a dot and a random suffix.
func MemoryJournal(memories, plugin string) string {
	return filepath.Join(memories, plugin+".jsonl")
}

// LockFile is held by the launcher for as long as a stack runs on dir.
func LockFile(dir string) string { return filepath.Join(dir, "clawmesh.lock") }

// SecretKey is the AES-256 key the config service encrypts secrets at
// rest with, created 0600 on first start.
func SecretKey(dir string) string { return filepath.Join(dir, ".secret_key") }

// DurableWoken marks a data directory whose durable bridge has run once:
// from then on it starts with the stack instead of sleeping until a
// client connects (it has state to keep and duties of its own: asks to
// raise again, texts waiting for a pane's next turn).
func DurableWoken(dir string) string { return filepath.Join(dir, "durable-bridge.woken") }

// Dormant marks a process the launcher holds the socket of and has not
// started yet (the durable bridge, upload-staging): the gateway shows it
// "dormant" while the file exists. The launcher removes it once the
// process serves, and when it stops.
func Dormant(dir, process string) string { return filepath.Join(dir, process+".dormant") }

// Starting held, for a launcher of the release before, while it started
// the stack, its pid, when the start began and what it waits for. That
// is now said by Processes; the CLI still reads this one (a launcher of
// the release before starting while the binaries were replaced), and a
// launcher removes one left behind.
func Starting(dir string) string { return filepath.Join(dir, "clawmesh.starting") }

// Processes holds, from the launcher's lock taken until it stops, what
// its start waits for (until the stack is up) and what it knows of each
// process that the gateway cannot: a process it is restarting (the
// attempt, the last exit, when the next run starts) and one that stopped
// answering its health check. `clawmesh status` reads it.
func Processes(dir string) string { return filepath.Join(dir, "clawmesh.processes") }
