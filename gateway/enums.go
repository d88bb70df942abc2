package gateway

import (
	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// The wire words of the session service's enums (docs/spec.md §5).
var (
	decisions = map[string]sessionv1.Decision{
		"allow_once":       sessionv1.Decision_DECISION_ALLOW_ONCE,
		"allow_always":     sessionv1.Decision_DECISION_ALLOW_ALWAYS,
		"reject":           sessionv1.Decision_DECISION_REJECT,
		"reject_with_edit": sessionv1.Decision_DECISION_REJECT_WITH_EDIT,
	}
	// decisionWords is decisions read the other way (init), so a word
	// is written once.
	decisionWords = make(map[sessionv1.Decision]string, 4)
	// surfaceWords are who decided, as an approval_request sent again
	// says it (decided_by); "service" for the service's own outcomes.
	surfaceWords = map[sessionv1.Surface]string{
		sessionv1.Surface_SURFACE_RPC:         "rpc",
		sessionv1.Surface_SURFACE_ELICITATION: "elicitation",
		sessionv1.Surface_SURFACE_DURABLE:     "durable",
	}
	stateWords = map[sessionv1.SessionState]string{
		sessionv1.SessionState_SESSION_STATE_IDLE:    "idle",
		sessionv1.SessionState_SESSION_STATE_RUNNING: "running",
		sessionv1.SessionState_SESSION_STATE_CLOSED:  "closed",
		sessionv1.SessionState_SESSION_STATE_KILLED:  "killed",
	}
	outcomeWords = map[sessionv1.TurnOutcome]string{
		sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED: "completed",
		sessionv1.TurnOutcome_TURN_OUTCOME_CANCELLED: "cancelled",
		sessionv1.TurnOutcome_TURN_OUTCOME_FAILED:    "failed",
	}
)

func init() {
	for w, d := range decisions {
		decisionWords[d] = w
	}
}
