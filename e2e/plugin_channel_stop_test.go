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
	s := pluginStack(t, []string{"webhook"}, "--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8")
	v := newConv(t, s, nil)

	hookURL, replies := replyHook(t)
	bindWebChannel(t, v, hookURL)
	listen := webChannelListen(t, v, "")
	for _, body := range []string{
		`{"id":"m1","from":"ann","text":"/sleep 5000\n/say first after the stop","thread":"t-1"}`,
		`{"id":"m2","from":"ann","text":"/say second after the stop","thread":"t-1"}`,
	} {
		postWebMessage(t, listen, []byte(body))
	}
	channelSessionID(t, v)
	victim := replicaPID(t, s, 0)
	if err := syscall.Kill(victim, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, 0, victim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the answers of the messages the stopped replica held", 90*time.Second, func() bool { return len(replies()) >= 2 })
	// Anything more (a late notice, an answer twice) comes within a
	// few of the follower's adopt rounds.
	time.Sleep(6 * time.Second)
	if got := replies(); !slices.Equal(got, []string{"first after the stop", "second after the stop"}) {
		t.Fatalf("replies %q, want each message answered once, in order, and no notice", got)
	}
}
