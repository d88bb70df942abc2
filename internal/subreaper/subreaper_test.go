package subreaper

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/procstat"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

// A process whose parent exits is adopted, and reaped once it exits,
// while the children os/exec starts keep their exit status for Wait.
func TestAdoptsAndReapsOrphans(t *testing.T) {
	stop, err := Start()
	if errors.Is(err, ErrNoPidfd) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// Own children, started and waited all through: none loses its status.
	ownDone := make(chan error, 1)
	go func() {
		for i := range 50 {
			cmd := exec.Command("sh", "-c", "exit 3")
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 {
				ownDone <- errors.New("own child " + strconv.Itoa(i) + ": " + errorText(err))
				return
			}
		}
		ownDone <- nil
	}()

	for range 5 {
		// sh starts a sleep and exits: the sleep is an orphan.
		out, err := exec.Command("sh", "-c", "sleep 0.2 >/dev/null 2>&1 & echo $!").Output()
		if err != nil {
			t.Fatal(err)
		}
		orphan, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		if st, err := procstat.Read(orphan); err == nil && st.PPID != os.Getpid() {
			t.Fatalf("orphan %d has parent %d, not this process %d", orphan, st.PPID, os.Getpid())
		}
		// Gone from /proc: exited and reaped, not left a zombie.
		testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() error {
			if st, err := procstat.Read(orphan); err == nil {
				return errors.New("orphan " + strconv.Itoa(orphan) + " still there, state " + string(st.State))
			}
			return nil
		})
	}
	if err := <-ownDone; err != nil {
		t.Fatal(err)
	}
	stop()
	stop()
}

func errorText(err error) string {
	if err == nil {
		return "exited 0"
	}
	return err.Error()
}
