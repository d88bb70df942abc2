package durablebridge

import (
	"context"
	"time"
)

// maxTokenRetry bounds the wait between two reads of a token that failed.
const maxTokenRetry = 30 * time.Second

// TokenSource keeps the bridge's token what Read returns (durable.token,
// a secret the config service reveals).
type TokenSource struct {
	Read func(context.Context) (string, error)
	Set  func(string) // the bridge's SetToken
	// Wake says the config changed in a way that may touch the token.
	Wake <-chan struct{}
	// Retry is the first wait after a failed read; it doubles to 30 s.
	Retry time.Duration
	// Log, if not nil, hears each failed read.
	Log func(error)
}

// Load reads the token once and sets it; a failed read sets none (""),
// so the token transport refuses every call meanwhile, never an old
// token's. It reports whether the read succeeded.
func (ts TokenSource) Load(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	tok, err := ts.Read(rctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			ts.Set("")
			if ts.Log != nil {
				ts.Log(err)
			}
		}
		return false
	}
	ts.Set(tok)
	return true
}

// Follow reads the token again at each Wake and, while the last read
// failed (loaded false at the start: Load's answer), after Retry,
// doubling, until one succeeds. Before, a read that failed (config hung
// just after answering the start's Live) was tried again only at the
// next announced config change: the bridge refused every token call
// until someone wrote the config. It returns when ctx is done.
func (ts TokenSource) Follow(ctx context.Context, loaded bool) {
	wait := ts.Retry
	timer := time.NewTimer(wait)
	if loaded {
		timer.Stop()
	}
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ts.Wake:
			timer.Stop()
		case <-timer.C:
		}
		if ts.Load(ctx) {
			wait = ts.Retry
			continue
		}
		if ctx.Err() != nil {
			return
		}
		wait = min(2*wait, maxTokenRetry)
		timer.Reset(wait)
	}
}
