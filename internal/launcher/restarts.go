package launcher

import (
	"context"
	"sync"
	"time"
)

// restartRepeat is how often every restart count is said again.
const restartRepeat = 2 * time.Second

// restartNotices tells the bus of each restart the supervisor makes, and
// says every count again each restartRepeat. A notice is a plain NATS
// message: a watcher not subscribed when it goes out never sees it, and
// the gateway's health would show the count it had before for good. That
// happens to a gateway started again (it begins at zero), and to one
// that reconnects to a bus back from an outage later than the launcher
// does, which then publishes to nobody.
type restartNotices struct {
	publish func(name string, count int) error

	mu sync.Mutex
	// counts are the counts announced, one entry per process of the
	// stack. Not the supervisor's own: it counts a restart when the
	// process exits, a backoff (up to 10 s) before the restart is made.
	counts map[string]int
}

func newRestartNotices(publish func(name string, count int) error) *restartNotices {
	return &restartNotices{publish: publish, counts: map[string]int{}}
}

// restarted records and announces the count of name's restarts. It
// publishes under the lock, as repeat does, so that a count said again
// never goes out after a newer one (a publish only queues the message
// on the connection).
func (r *restartNotices) restarted(name string, count int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[name] = count
	_ = r.publish(name, count)
}

// repeat says every recorded count again each interval until ctx ends.
func (r *restartNotices) repeat(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		for name, n := range r.counts {
			_ = r.publish(name, n)
		}
		r.mu.Unlock()
	}
}
