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

// setWritten is set, returning once the state file says what: said
// before a process starts, it is what status reads as soon as anything
// can see the process. The postgres start set its wait only after the
// postmaster ran, and status, asked by someone who had seen the
// postmaster's pid file, could still read that the cluster was being
// prepared (the writer had not written the change yet).
func (s *startState) setWritten(what string) {
	s.set(what)
	s.states.flush()
}
