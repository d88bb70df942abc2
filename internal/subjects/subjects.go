// Package subjects names the NATS subjects the processes share, so a
// publisher and its subscribers cannot drift apart.
package subjects

// SessionUpdatePrefix starts every session's update subject.
const SessionUpdatePrefix = "clawmesh.session."

// SessionUpdate carries one session's session/update events, each a
// protobuf-encoded clawmesh.session.v1.Update.
func SessionUpdate(sessionID string) string { return SessionUpdatePrefix + sessionID + ".update" }

// ConfigChanged carries the config service's commits (revision, props,
// masked document).
const ConfigChanged = "clawmesh.config.changed"

// SupervisorRestarts carries the launcher's restart notices:
// {"service": name, "restart_count": n}.
const SupervisorRestarts = "clawmesh.supervisor.restarts"

// ConnAsk is the request-reply subject on which a service asks one client
// connection something through the gateway (see gateway/ask).
func ConnAsk(connID string) string { return "clawmesh.gateway.conn." + connID + ".ask" }
