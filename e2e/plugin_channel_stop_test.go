package e2e_test

import (
	"slices"
	"syscall"
	"testing"
	"time"
)

// A sandbox replica stopped in order (SIGTERM, as an upgrade or the
// operator's restart stops it) while it held channel messages it had
// answered 202 for told their senders to send them again ("the channel
// was reconfigured or stopped"), and dropped them from its spool: a
// webhook cannot send again, and a chat user who did had the turn run
// twice. A stopping replica now leaves what it accepted in its spool,
// and the replica that follows delivers it, each message answered once.
func TestPluginChannelMessagesOutliveAReplicaStop(t *testing.T) {
	t.Parallel()
	replies := repliesAfterReplicaSignal(t, syscall.SIGTERM, "the stop")
	// Anything more (a late notice, an answer twice) comes within a
	// few of the follower's adopt rounds.
	time.Sleep(6 * time.Second)
	if got := replies(); !slices.Equal(got, []string{"first after the stop", "second after the stop"}) {
		t.Fatalf("replies %q, want each message answered once, in order, and no notice", got)
	}
}
