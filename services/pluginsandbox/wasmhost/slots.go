package wasmhost

import (
	"context"
	"fmt"
	"sync"
)

// slots is the host-wide instance cap (plugins.limits.max_instances). Every
// live instance holds a slot: pooled, running or persistent. A call that
// finds no free slot first evicts an idle pooled instance, then waits until
// a slot frees or its context ends.
type slots struct {
	mu      sync.Mutex
	max     int
	used    int
	waiters int
	changed chan struct{} // closed and replaced on every release
	evict   func() bool   // closes one idle pooled instance, if any
}

func newSlots(max int) *slots {
	return &slots{max: max, changed: make(chan struct{})}
}

// acquire takes a slot, waiting at most until ctx ends.
func (s *slots) acquire(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.used < s.max {
			s.used++
			s.mu.Unlock()
			return nil
		}
		ch := s.changed
		s.waiters++
		s.mu.Unlock()

		evicted := s.evict != nil && s.evict()
		var err error
		if !evicted {
			select {
			case <-ch:
			case <-ctx.Done():
				err = fmt.Errorf("%w: all %d instances in use", ErrInstanceLimit, s.max)
			}
		}
		s.mu.Lock()
		s.waiters--
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// tryAcquireIdle takes a slot only when one is free and nobody waits; the
// pool uses it so that pre-instantiation never competes with calls.
func (s *slots) tryAcquireIdle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used >= s.max || s.waiters > 0 {
		return false
	}
	s.used++
	return true
}

func (s *slots) release() {
	s.mu.Lock()
	s.used--
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// idleAdded wakes the waiters when an idle pooled instance appeared: it
// holds a slot they can take by evicting it. Without this, a pool that was
// still instantiating when a call started waiting kept its slot, and the
// call waited for a release that never came.
func (s *slots) idleAdded() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters > 0 {
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

func (s *slots) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// spare reports whether a slot is free now, with nobody waiting for it.
func (s *slots) spare() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used < s.max && s.waiters == 0
}
