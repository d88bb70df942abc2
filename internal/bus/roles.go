package bus

// Role is a process identity on the bus. Each process of the stack
// connects under its own role's credential, and the server lets it
// publish and subscribe only what Permissions lists: the one table of who
// may say what on the bus (docs/design.md reproduces it).
type Role string

// Roles.
const (
	RoleLauncher Role = "launcher"
	RoleGateway  Role = "gateway"
	RoleConfig   Role = "config"
	RoleSession  Role = "session"
	RoleUpload   Role = "upload-staging"
	RolePlugin   Role = "plugin-sandbox"
	RoleDurable  Role = "durable-bridge"
)

// Roles lists every role.
var Roles = []Role{RoleLauncher, RoleGateway, RoleConfig, RoleSession, RoleUpload, RolePlugin, RoleDurable}

// Permissions are the subjects a role may publish and subscribe.
// Responses, when set, lets the role answer the requests it receives (one
// reply each) without a publish permission on reply subjects.
type Permissions struct {
	Publish, Subscribe []string
	Responses          bool
}

// InboxPrefix is the prefix of a role's reply subjects: a role that makes
// requests subscribes only its own inbox, so no role reads another's
// replies.
func (r Role) InboxPrefix() string { return "_INBOX_" + string(r) }

// Permissions is the table. A role missing here may do nothing.
func (r Role) Permissions() Permissions {
	switch r {
	case RoleLauncher:
		return Permissions{Publish: []string{SubjectRestarts}}
	case RoleConfig:
		return Permissions{Publish: []string{SubjectConfigChanged}}
	case RoleSession:
		// Publishes every session's updates and asks connections through
		// the gateway; follows config changes.
		return Permissions{
			Publish:   []string{SubjectAllSessionUpdates, SubjectAllAsks},
			Subscribe: []string{SubjectConfigChanged, RoleSession.InboxPrefix() + ".>"},
		}
	case RoleGateway:
		// Reads updates of the sessions its connections attached to (the
		// session service decides which), answers asks for its own
		// connections, follows config and restarts.
		return Permissions{
			Subscribe: []string{SubjectAllSessionUpdates, SubjectAllAsks, SubjectConfigChanged, SubjectRestarts},
			Responses: true,
		}
	case RoleDurable:
		return Permissions{Subscribe: []string{SubjectAllSessionUpdates, SubjectConfigChanged}}
	case RoleUpload, RolePlugin:
		return Permissions{Subscribe: []string{SubjectConfigChanged}}
	}
	return Permissions{}
}
