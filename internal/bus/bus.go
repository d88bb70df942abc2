// Package bus owns everything the processes exchange on NATS: the
// subjects, the messages (proto/clawmesh/bus/v1, built and parsed only
// here), and the permissions of each process identity on them (roles.go).
//
// Subjects are built only from validated tokens (internal/ids): an id that
// is not one is refused with ErrBadToken before anything touches NATS, so
// a client-chosen id can never become a wildcard ("*", ">"), add a token
// (".") or make the server refuse the subject.
//
// A bus message is a notification, never an authority. A config change
// names a revision that consumers read back from the config service; a
// gateway follows a session's updates only on the subject the session
// service returned when it accepted the attach.
package bus

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/clawmesh/clawmesh/internal/ids"
)

// Subjects. Every subject the stack uses is one of these.
const (
	// SubjectConfigChanged carries busv1.ConfigChanged; only the config
	// service publishes it.
	SubjectConfigChanged = "clawmesh.config.changed"
	// SubjectRestarts carries busv1.ProcessRestarted; only the launcher
	// publishes it.
	SubjectRestarts = "clawmesh.supervisor.restarts"

	sessionPrefix = "clawmesh.session."
	sessionSuffix = ".update"
	askPrefix     = "clawmesh.gateway.conn."
	askSuffix     = ".ask"
)

// Wildcard subjects, for permissions and monitoring.
const (
	// SubjectAllSessionUpdates matches every session's updates: the
	// tokens are the session id and its incarnation.
	SubjectAllSessionUpdates = sessionPrefix + "*.*" + sessionSuffix
	// SubjectAllAsks matches every connection's asks.
	SubjectAllAsks = askPrefix + "*" + askSuffix
)

// Errors.
var (
	// ErrBadToken: an id meant to become a subject token is not one.
	ErrBadToken = errors.New("bus: not a valid subject token")
	// ErrBadSubject: a subject is not of the expected kind.
	ErrBadSubject = errors.New("bus: unexpected subject")
	// ErrDecode: a message on a subject is not what the subject carries.
	ErrDecode = errors.New("bus: undecodable message")
	// ErrEncode: a message cannot be encoded as its subject carries it.
	ErrEncode = errors.New("bus: unencodable message")
)

// SessionUpdateSubject is the subject of the updates of one incarnation
// of a session: the session service's number for the stored session
// (positive, never given twice). A deleted session's id may name a new
// session at once, while updates of the deleted one, its deletion last,
// are still on their way to subscribers; each has a subject of its own,
// so no subscriber of one hears the other.
func SessionUpdateSubject(sessionID string, incarnation int64) (string, error) {
	if !ids.Token(sessionID) {
		return "", fmt.Errorf("%w: session id", ErrBadToken)
	}
	if incarnation <= 0 {
		return "", fmt.Errorf("%w: session incarnation %d", ErrBadToken, incarnation)
	}
	return sessionPrefix + sessionID + "." + strconv.FormatInt(incarnation, 10) + sessionSuffix, nil
}

// SessionOfSubject returns the session id and incarnation a session
// update subject names, or ErrBadSubject when subject is not one. The id
// is a slice of subject.
func SessionOfSubject(subject string) (id string, incarnation int64, err error) {
	rest, ok := strings.CutPrefix(subject, sessionPrefix)
	if !ok {
		return "", 0, ErrBadSubject
	}
	rest, ok = strings.CutSuffix(rest, sessionSuffix)
	if !ok {
		return "", 0, ErrBadSubject
	}
	id, n, ok := strings.Cut(rest, ".")
	if !ok || !ids.Token(id) {
		return "", 0, ErrBadSubject
	}
	incarnation, err = strconv.ParseInt(n, 10, 64)
	// One spelling for each number: no sign, no leading zero.
	if err != nil || incarnation <= 0 || n[0] == '+' || n[0] == '0' {
		return "", 0, ErrBadSubject
	}
	return id, incarnation, nil
}

// AskSubject is the subject on which the gateway holding connection
// connID answers asks for it.
func AskSubject(connID string) (string, error) {
	if !ids.Token(connID) {
		return "", fmt.Errorf("%w: connection id", ErrBadToken)
	}
	return askPrefix + connID + askSuffix, nil
}
