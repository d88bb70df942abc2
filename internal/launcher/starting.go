package launcher

import (
	"fmt"
	"time"
)

// startState says what the start waits for: the gateway, which answers
// status, starts last, so a start waiting for PostgreSQL (a new
// cluster's initdb, a slow disk, a server stopped) showed to `clawmesh
// status` as no stack at all, with the advice to start one, which the
// lock then refused. It is said in the launcher's state file
// (procStates.starting); it was a file of its own, datadir.Starting,
// written beside that one.
type startState struct {
	states *procStates
	since  time.Time
}

func newStartState(states *procStates) *startState {
	return &startState{states: states, since: time.Now()}
}

// set says the start now waits for what.
func (s *startState) set(what string) { s.states.starting(s.since, what) }

// setf is set with a format.
func (s *startState) setf(format string, args ...any) { s.set(fmt.Sprintf(format, args...)) }
