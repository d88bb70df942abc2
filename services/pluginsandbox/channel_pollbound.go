package pluginsandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/services/pluginsandbox/wasmhost"
)

// pollRefusals is what a binding's poller keeps of the last polled
// message the host refused for its size (wasmhost.PollRefusedError).
type pollRefusals struct {
	// last is the refused message's key (refusalKey), until a poll
	// answers something else.
	last string
	// again counts the answers of last since it was refused, or since
	// the instance was rebuilt for it: at most the binding's refusedAnswers.
	again int
	// stalled is set once the plugin answered that message again: the
	// binding's reason says so until it answers something else.
	stalled bool
	// rebuilt is set once the instance was rebuilt for last, stuck once
	// the rebuilt one answered it that many times again: a plugin
	// whose own service holds the message (unread mail) answers it from
	// any instance, and one rebuild a message is all the host does.
	// Stuck, the binding has failed (failStalled).
	rebuilt, stuck bool
	// waiting is the count of queued messages the binding's reason
	// last gave, while stuck.
	waiting int
	// wait is how long the poller waits, while stuck, before it polls
	// the plugin again, and next when; later fires then (pollLater).
	wait  time.Duration
	next  time.Time
	later *time.Timer
}

// refusalKey tells one refused message from another the plugin answers
// without reading the inbound queue again: a digest, of a fixed size
// whatever the fields' (each up to 16 KiB), as the spool keeps it
// (spoolHeldMark).
func refusalKey(r *wasmhost.PollRefusedError) string {
	m := r.Msg
	sum := sha256.Sum256([]byte(strings.Join([]string{r.Field, strconv.Itoa(r.Size), m.ID, m.Sender, m.ReplyTarget, m.ThreadID}, "\x00")))
	return hex.EncodeToString(sum[:])
}

// pollRefused handles a polled message that the host refused for its
// size (its content past channels.plugin.<alias>.max_content_kb, another
// field past 16 KiB). pollOne has already dropped the spool's files of
// what the plugin read for it: the message is refused for good, as one
// refused by a full backlog is. It was dropped with a warning ("channel
// poll failed") and its sender, answered 202, was never told. Now it is
// logged with its size and bound, and its sender (reply target, else
// sender, and thread, as far as they were within their bounds) is told
// through the plugin, by the notifier.
//
// A plugin that answers the same message again at its next poll (one
// that moves past a message of its service only once the host took it)
// would have its sender told once a second: the same message answered
// again with no read of the inbound queue in between is not told again;
// it is logged once, and the binding's reason (ListChannels) says that
// the channel takes nothing until the plugin moves past it. It reports
// whether the poll refused a new message, after which the poller polls
// on (the next message may be waiting).
//
// A plugin with the poll_refused flag was told of each refusal by the
// wasmhost (r.Told): one that drops the message goes on; one that
// answers it again all the same is polled no faster than one without
// the flag (here, at most once a poll interval or a queued message), is
// told again at each of those polls, and is logged once, as above.
//
// Either kind stalled its channel for good: the messages accepted (202)
// behind the refused one were never delivered. After refused_answers
// more answers of it the host now rebuilds the instance it polls on
// (rebuildForRefusal), as it does after a trap: the plugin's memory of
// the message is gone, the inbound queue is the host's and stays, and
// the next message is polled at once.
func (b *binding) pollRefused(ctx context.Context, r *wasmhost.PollRefusedError, read []string, polled time.Time, p *pollRefusals) bool {
	if refusingHook != nil {
		refusingHook(len(read))
	}
	key := refusalKey(r)
	log := b.log.With(zap.String("message_id", r.Msg.ID), zap.String("field", r.Field),
		zap.Int("bytes", r.Size), zap.Int("bound", r.Bound), zap.Bool("plugin_told", r.Told))
	if r.TellErr != nil {
		log = log.With(zap.NamedError("tell_error", r.TellErr))
	}
	if len(read) == 0 && key == p.last {
		return b.answeredAgain(ctx, r, log, p)
	}
	p.reset(b)
	p.last = key
	if !b.spool.claimHeld(key, len(read) > 0, polled) {
		// Another process (this one before a restart, or another
		// replica of the alias polling the same plugin's service, at
		// any time or during this very poll) told its sender.
		log.Info("channel message refused for its size: its sender was told by another process")
		return true
	}
	log.Warn("channel message refused: past the bound of a polled message")
	select {
	case b.dl.notices <- backlogNotice{r.Msg, refusedNotice(r)}:
	default:
		log.Warn("channel notice dropped: too many notices waiting")
	}
	return true
}

// answeredAgain handles the plugin's answer of the refused message p.last
// once more. It reports whether the poller polls on at once (the
// instance was rebuilt, and the next message may be waiting).
func (b *binding) answeredAgain(ctx context.Context, r *wasmhost.PollRefusedError, log *zap.Logger, p *pollRefusals) bool {
	p.again++
	answers := b.cfg.refusedAnswers()
	what := fmt.Sprintf("a message whose %s is %d bytes, past the %d a polled message's %s may be", r.Field, r.Size, r.Bound, r.Field)
	heard := "the plugin does not take the host's word of a refusal (the poll_refused flag): update it"
	if r.Told {
		heard = "the plugin was told it was refused, and answers it all the same"
	}
	if !p.stalled && !p.rebuilt {
		p.stalled = true
		log.Warn("channel poll answered again a message refused for its size: the channel takes no message until its plugin moves past it or is rebuilt",
			zap.Int("rebuilt_after", answers))
		b.set(channelRunning, fmt.Sprintf("poll: the plugin answers again and again %s; the channel takes no message until the plugin moves past it, or its instance is rebuilt at the %d-th answer; %s",
			what, answers+1, heard))
	}
	if p.stuck {
		if n := b.inbound.Pending(); n != p.waiting {
			p.waiting = b.failStalled(what, heard)
		}
		p.pollLater()
		return false
	}
	if p.again < answers {
		return false
	}
	if p.rebuilt {
		p.stuck, p.stalled = true, true
		p.waiting = b.failStalled(what, heard)
		log.Warn("channel plugin rebuilt for a message refused for its size answers it still: the binding fails, and its listener refuses new messages until the plugin moves past it, is replaced or the channel is rebound",
			zap.Int("answers", answers), zap.Int("queued", p.waiting))
		p.pollLater()
		return false
	}
	if err := b.ch.ResetPoll(ctx); err != nil {
		if ctx.Err() == nil {
			log.Warn("channel plugin not rebuilt", zap.Error(err))
		}
		return false
	}
	p.rebuilt, p.again = true, 0
	// The reason outlives the stall: the operator reads why the
	// plugin lost its memory.
	p.stalled = false
	log.Warn("channel plugin rebuilt: it answered again and again a message refused for its size, and its new instance forgets it",
		zap.Int("answers", answers+1))
	b.set(channelRunning, fmt.Sprintf("poll: the plugin's instance was rebuilt at %s, which forgets what it held: it answered %d times %s; %s",
		time.Now().UTC().Format(time.RFC3339), answers+1, what, heard))
	return true
}

// failStalled fails the binding whose plugin answers again, from the
// instance rebuilt for it, a message refused for its size: the plugin's
// own service holds it, and nothing the host does moves it past it.
//
// What the host does then, and why. Kept "running", the binding took
// new messages (202) that no poll would reach, and its state told no
// one; nothing accepted may be lost without its sender being told. So
// the binding's state is failed, with the reason (plugins/list), and
// its listener answers new messages 503 saying why, before they are
// taken (a post in the moment it fails is ordered with it: queued and
// counted before, or refused after). It is not retried at each scan, as another failure is: a
// new binding of the same plugin and settings would poll the same
// message again. The messages accepted before stay in the host's queue
// and spool, in order, and the poller keeps polling at the interval:
//   - the plugin moves past the message (its service lets it go): the
//     binding runs again (clear), and delivers them;
//   - the plugin is replaced or upgraded, or the alias rebound with
//     other settings: the binding that follows takes the queue over
//     (a hand-over, as any rebind) and delivers them, and knows the
//     refused message (heldKey, and the spool's mark of it for a
//     process that follows: spoolHeldMark), whose sender is not told
//     twice;
//   - the alias is unbound or bound to another plugin: as for any
//     unbind, what the plugin cannot read into a message stays in the
//     spool (counted in the warning, shown by status) for the next
//     binding of that plugin, or is dropped without one, logged with
//     its count: the host cannot read a sender out of the plugin's
//     shape of message to tell it.
//
// The listener's admissions are held off while it fails (b.admit): a
// post that passed the listener's check before is queued, and counted
// in the reason, before the binding fails; one after is refused. It
// returns that count, of the messages that wait behind the held one.
func (b *binding) failStalled(what, heard string) int {
	if failingHook != nil {
		failingHook()
	}
	b.admit.Lock()
	defer b.admit.Unlock()
	queued := b.inbound.Pending()
	why := "the channel takes no new message: its plugin answers again and again a message the host refused for its size, which the plugin's own service holds; the operator replaces the plugin or rebinds the channel; retry later"
	b.stalled.Store(&why)
	b.set(channelFailed, fmt.Sprintf("poll: the plugin's instance was rebuilt, and the new one answers again %s: the plugin's own service holds it; %s. The channel refuses new messages (503); the %d accepted before wait in its queue, to be delivered once the plugin moves past it, is replaced or upgraded, or the channel is rebound; meanwhile the plugin is polled after %d s, then at a wait doubling up to %d s",
		what, heard, queued, int(stalledPollFirst.Seconds()), int(stalledPollMax.Seconds())))
	if failedHook != nil {
		failedHook(queued)
	}
	return queued
}

// Test hooks (export_test.go): admitHook is called as a post passed the
// listener's check of stalled; failingHook as failStalled begins, and
// failedHook once it failed the binding, with the count it gave.
var (
	admitHook   func()
	failingHook func()
	failedHook  func(queued int)
	// refusingHook is called as pollRefused begins, with the number of
	// queued messages the plugin read for the refused one.
	refusingHook func(read int)
	// stalledPollHook is called as a failed binding's poller sets the
	// wait before its next poll of the plugin.
	stalledPollHook func(wait time.Duration)
)

// A failed binding's plugin was polled at the poll interval for as long
// as it stayed failed: a call of the plugin's service a second, for days,
// for a poll whose only use is to see the service let the message go
// (the binding then runs again by itself). It backs off: the first poll
// after the failure waits stalledPollFirst, each one after twice the one
// before, up to stalledPollMax, the Retry-After its listener gives new
// posts. Nothing else wakes such a poll (a queued message, a delivery's
// end): the listener refuses new ones, and what was accepted waits behind
// the held message. A new binding (an upgrade, a rebind) polls at the
// interval again, and so does this one once the plugin answers anything
// else.
const stalledPollFirst = 2 * pollEvery

// stalledPollMax bounds a failed binding's wait between polls; a
// variable so that a test may lower it.
var stalledPollMax = 60 * time.Second

// pollLater sets when a failed binding's plugin is polled next: the wait
// doubled, within its bounds.
func (p *pollRefusals) pollLater() {
	p.wait = min(max(2*p.wait, stalledPollFirst), stalledPollMax)
	if stalledPollHook != nil {
		stalledPollHook(p.wait)
	}
	p.next = time.Now().Add(p.wait)
	if p.later == nil {
		p.later = time.NewTimer(p.wait)
	} else {
		p.later.Reset(p.wait)
	}
}

// due is what wakes the poller for a failed binding's next poll (nil
// while the binding runs: the interval's tick does).
func (p *pollRefusals) due() <-chan time.Time {
	if !p.stuck || p.later == nil {
		return nil
	}
	return p.later.C
}

// held is whether the poller leaves the plugin alone now: a failed
// binding's wait (pollLater) has not passed.
func (p *pollRefusals) held() bool {
	return p.stuck && time.Now().Before(p.next)
}

// clear forgets the last refusal, and the spool's mark of it: the plugin
// answered something else.
func (p *pollRefusals) clear(b *binding) {
	if p.last != "" {
		b.spool.unmarkHeld(p.last)
	}
	p.reset(b)
}

// reset forgets the last refusal, leaving the spool's mark to the next.
func (p *pollRefusals) reset(b *binding) {
	if p.later != nil {
		p.later.Stop()
	}
	if p.stuck {
		b.stalled.Store(nil)
		b.log.Info("channel plugin moved past the message refused for its size that its service held: the channel takes messages again")
	}
	if p.stalled {
		b.set(channelRunning, "")
	}
	*p = pollRefusals{}
}

// refusedNotice is what the sender of a message refused for its size is
// told.
func refusedNotice(r *wasmhost.PollRefusedError) string {
	if r.Field == "content" {
		return fmt.Sprintf("This message was not delivered: it is %d bytes long, and this channel takes messages of at most %d bytes; send it shorter, or in parts.", r.Size, r.Bound)
	}
	return fmt.Sprintf("This message was not delivered: its %s is %d bytes long, and this channel takes at most %d.", strings.ReplaceAll(r.Field, "_", " "), r.Size, r.Bound)
}
