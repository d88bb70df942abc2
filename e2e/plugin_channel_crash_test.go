package e2e_test

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A sandbox replica killed while it held channel messages it had answered
// 202 for (one in its turn, one waiting behind it in its conversation)
// lost them without a word: no answer, no notice, nothing in the log of
// the replica that followed. The listener now keeps each accepted message
// on disk until it is answered or its sender told, and the replica that
// follows (here the same one, restarted) delivers what the dead one held.
func TestPluginChannelMessagesOutliveAReplicaKill(t *testing.T) {
	t.Parallel()
	replies := repliesAfterReplicaSignal(t, syscall.SIGKILL, "the kill")
	if got := replies(); !slices.Equal(got[:2], []string{"first after the kill", "second after the kill"}) {
		t.Fatalf("replies %q, want both answers in order", got)
	}
}

// repliesAfterReplicaSignal posts two messages on one web-channel thread
// ("first after <after>", its turn 5 s long, and "second after
// <after>"), signals sandbox replica 0 with sig while the first turn
// runs, and returns the channel's replies once two came from the replica
// that followed.
func repliesAfterReplicaSignal(t *testing.T, sig syscall.Signal, after string) (replies func() []string) {
	t.Helper()
	s, v, listen, replies := webChannelStack(t, false)
	for _, body := range []string{
		`{"id":"m1","from":"ann","text":"/sleep 5000\n/say first after ` + after + `","thread":"t-1"}`,
		`{"id":"m2","from":"ann","text":"/say second after ` + after + `","thread":"t-1"}`,
	} {
		postWebMessage(t, listen, []byte(body))
	}
	// The first turn runs (the session exists) when the replica goes.
	channelSessionID(t, v)
	victim := replicaPID(t, s, 0)
	if err := syscall.Kill(victim, sig); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, 0, victim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the answers of the messages the replica held at "+after, 90*time.Second, func() bool { return len(replies()) >= 2 })
	return replies
}

// A message the plugin gave no id (the host gives it one) was given a
// new one when the replica that followed a kill delivered it again from
// the spool: its idempotency key differed, so its turn ran again from
// the start and its tool acted twice. The host's id is now kept with the
// message on disk.
func TestPluginChannelRedeliveryKeepsTheHostID(t *testing.T) {
	t.Parallel()
	s, v, listen, replies := webChannelStack(t, true)
	text := "/tool " + echoTool + ` {"msg":"paid once"}` + "\n/sleep 5000\n/say done after the kill"
	body, _ := json.Marshal(map[string]string{"from": "ann", "text": text, "thread": "t-1"})
	postWebMessage(t, listen, body)
	id := channelSessionID(t, v)
	waitFor(t, "the tool's result", 30*time.Second, func() bool { return channelToolRows(t, v, id, echoTool) == 1 })
	victim := replicaPID(t, s, 0)
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitRestarted(s, 0, victim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the answer of the cut turn", 90*time.Second, func() bool { return len(replies()) > 0 })
	if got := replies(); !strings.HasSuffix(got[0], "done after the kill") {
		t.Fatalf("replies %q, want the cut turn's answer", got)
	}
	if n := channelToolRows(t, v, id, echoTool); n != 1 {
		t.Fatalf("the tool ran %d times for one message without an id, want once", n)
	}
}
