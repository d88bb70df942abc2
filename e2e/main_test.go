// Package e2e_test runs the whole stack from its real binaries, as a user
// would with `clawmesh up`, and talks to it over the socket.
//
// Every test runs in parallel with the others (as many at once as
// -parallel, GOMAXPROCS by default, at most maxParallel) but the one that
// plants a stale cluster for doctor --fix to remove (any other test's
// start of a private cluster would remove it first; serial tests run
// alone, before the parallel ones): each test's stack has its own data
// directory, socket, bus and database, and most of a test's time is spent
// waiting for a timeout, a restart or a stall to happen (on two cores:
// 214 s in sequence, 147 s two at a time).
package e2e_test

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
	"github.com/clawmesh/clawmesh/internal/profiling"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

func TestMain(m *testing.M) {
	// The benchmarks' baselines run in processes of their own, like the
	// stack's, so both pay the same cross-process round trips
	// (startChild); each child lives as long as the test that started it.
	switch {
	case os.Getenv(echoEnv) != "":
		go exitWithParent(nil)
		n, _ := strconv.Atoi(os.Getenv(echoReplyEnv))
		serveEcho(os.Getenv(echoEnv), n)
		return
	case os.Getenv(busChildEnv) != "":
		go exitWithParent(nil)
		serveBus(os.Getenv(busChildEnv))
		return
	case os.Getenv(natsEnv) != "":
		go exitWithParent(nil)
		serveNATS(os.Getenv(natsEnv))
		return
	case os.Getenv(publishEnv) != "":
		go exitWithParent(nil)
		servePublisher(os.Getenv(forwardNATSEnv), os.Getenv(publishEnv))
		return
	case os.Getenv(forwardEnv) != "":
		// Profiled as the gateway is (CLAWMESH_PROFILE_DIR), so the two
		// ends of the turn stream's second leg compare symbol by symbol.
		stop, err := profiling.Start("forwarder")
		if err != nil {
			fmt.Fprintln(os.Stderr, "forwarder:", err)
			os.Exit(2)
		}
		go exitWithParent(stop)
		serveForwarder(os.Getenv(forwardEnv), os.Getenv(forwardNATSEnv))
		return
	case os.Getenv(discardEnv) != "":
		go exitWithParent(nil)
		serveDiscard(os.Getenv(discardEnv))
		return
	}
	flag.Parse()
	capParallel()
	code := m.Run()
	testenv.Stop()
	e2e.Cleanup()
	guestbuild.Cleanup()
	os.Exit(code)
}

// maxParallel bounds the stacks that run at once when -parallel is not
// given: GOMAXPROCS of them on a machine with many cores would open more
// connections than the shared cluster takes (300; each service's pool
// may hold as many as the machine has cores).
const maxParallel = 4

func capParallel() {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given && runtime.GOMAXPROCS(0) > maxParallel {
		_ = flag.Set("test.parallel", strconv.Itoa(maxParallel))
	}
}
