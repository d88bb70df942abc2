package launcher

import (
	"context"
	"strings"
	"testing"
	"time"
)

// With the database unreachable, config waits for it before it answers
// any health check, and a peer that needs config (plugin-sandbox reads
// the live config at start) gives up and exits first: `clawmesh up`
// ended with that peer's words alone ("plugin-sandbox exited during
// start: ... config service: read the live config: ... DeadlineExceeded
// ..."), the database nowhere on the terminal. The processes still not
// ready are named with the last line of their logs, where config says
// what it waits for.
func TestExitDuringStartNamesWhatStillWaits(t *testing.T) {
	r := newRig(t, 0)
	waits := r.proc("waits", "slowstart", "FAKE_LIFE=1m", "FAKE_MESSAGE=waiting for the database: connection refused")
	gives := r.proc("givesup", "crash", "FAKE_LIFE=700ms", "FAKE_MESSAGE=config service: read the live config: deadline exceeded")
	for _, p := range []*proc{waits, gives} {
		if err := r.sup.start(p, noStop); err != nil {
			t.Fatal(err)
		}
	}
	err := r.sup.waitReady(context.Background(), time.Minute, []*proc{waits, gives})
	if err == nil || !strings.Contains(err.Error(), "givesup exited during start") ||
		!strings.Contains(err.Error(), "waits") || !strings.Contains(err.Error(), "waiting for the database: connection refused") {
		t.Fatalf("exit during start with another process waiting: %v", err)
	}
}
