package config

import (
	"fmt"
	"slices"

	"github.com/clawmesh/clawmesh/internal/configschema"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
)

// The permission names, from the schema.
const (
	PermAdmin        = configschema.PermAdmin
	PermConfigRead   = configschema.PermConfigRead
	PermConfigUpdate = configschema.PermConfigUpdate
	PermFilesCreate  = configschema.PermFilesCreate
	PermAgentUse     = configschema.PermAgentUse
)

// decision is an authorization answer with the reason of a refusal.
type decision struct {
	allowed bool
	reason  string
}

func allow() decision { return decision{allowed: true} }

func deny(format string, args ...any) decision {
	return decision{reason: fmt.Sprintf(format, args...)}
}

// profile is one permission profile as the document holds it.
type profile struct {
	name                       string
	permissions, paths, agents []string
}

func (p profile) has(perm string) bool { return slices.Contains(p.permissions, perm) }

// coversPath reports whether a config_paths entry covers path.
func (p profile) coversPath(path string) bool {
	for _, pattern := range p.paths {
		if configschema.MatchPattern(pattern, path) {
			return true
		}
	}
	return false
}

// profiles returns the profiles a principal holds under this snapshot, or
// a refusal when the principal's binding no longer stands: the user was
// removed, its token revoked, or its uid changed.
func (sn *snapshot) profiles(pr *commonv1.Principal) ([]profile, decision) {
	user := pr.GetUser()
	if user == "" {
		return nil, deny("principal %q is not a user", pr.GetPrincipalId())
	}
	entry, ok := sn.doc["users"].(map[string]any)[user].(map[string]any)
	if !ok {
		return nil, deny("user %q does not exist", user)
	}
	if id := pr.GetTokenId(); id != "" {
		if sn.tokens[id] != user {
			return nil, deny("the token of user %q was revoked", user)
		}
	} else if uid, ok := entry["uid"].(int64); !ok || !peerIs(pr.GetPeerUid(), uid) {
		return nil, deny("uid %d is no longer bound to user %q", uint32(pr.GetPeerUid()), user)
	}
	all, _ := sn.doc["permission_profiles"].(map[string]any)
	var out []profile
	for _, name := range stringList(entry["permission_profiles"]) {
		fields, ok := all[name].(map[string]any)
		if !ok {
			continue
		}
		out = append(out, profile{name: name, permissions: stringList(fields["permissions"]),
			paths: stringList(fields["config_paths"]), agents: stringList(fields["agents"])})
	}
	return out, allow()
}

// authorize answers whether pr holds permission on resource:
//   - the operator holds every permission; so does a profile with "admin";
//   - Config:Read and Config:Update need the permission and a config_paths
//     entry covering the path, in the same profile (Config:Update implies
//     Config:Read);
//   - agent:use needs the alias (or "*") in a profile's agents;
//   - any other permission needs its name in a profile's permissions.
func (sn *snapshot) authorize(pr *commonv1.Principal, permission, resource string) decision {
	if pr == nil {
		return deny("no principal")
	}
	if pr.GetOperator() && pr.GetPrincipalId() == OperatorPrincipal {
		return allow()
	}
	profiles, d := sn.profiles(pr)
	if !d.allowed || permission == configschema.PermStanding {
		return d
	}
	for _, p := range profiles {
		if p.has(PermAdmin) {
			return allow()
		}
		switch permission {
		case PermConfigRead:
			if (p.has(PermConfigRead) || p.has(PermConfigUpdate)) && p.coversPath(resource) {
				return allow()
			}
		case PermConfigUpdate:
			if p.has(PermConfigUpdate) && p.coversPath(resource) {
				return allow()
			}
		case PermAgentUse:
			if slices.Contains(p.agents, resource) || slices.Contains(p.agents, "*") {
				return allow()
			}
		default:
			if p.has(permission) {
				return allow()
			}
		}
	}
	if resource != "" {
		return deny("%s does not hold %s on `%s`", pr.GetPrincipalId(), permission, resource)
	}
	return deny("%s does not hold %s", pr.GetPrincipalId(), permission)
}

// holds lists the permission names pr holds on at least one resource:
// every one for the operator and an admin; Config:Update implies
// Config:Read; agent:use when a profile names an agent.
func (sn *snapshot) holds(pr *commonv1.Principal) []string {
	if pr.GetOperator() && pr.GetPrincipalId() == OperatorPrincipal {
		return slices.Clone(configschema.Permissions)
	}
	profiles, d := sn.profiles(pr)
	if !d.allowed {
		return nil
	}
	set := map[string]bool{}
	for _, p := range profiles {
		if p.has(PermAdmin) {
			return slices.Clone(configschema.Permissions)
		}
		for _, perm := range p.permissions {
			set[perm] = true
		}
		if p.has(PermConfigUpdate) {
			set[PermConfigRead] = true
		}
		if len(p.agents) > 0 {
			set[PermAgentUse] = true
		}
	}
	out := make([]string, 0, len(set))
	for _, perm := range configschema.Permissions {
		if set[perm] {
			out = append(out, perm)
		}
	}
	return out
}

// peerIs reports whether a peer's uid, as it travels (an int32, since
// the wire has no unsigned type), is uid. A uid is 32 bits without a
// sign: read as signed, one past 2^31-1 was negative and matched no
// users.<name>.uid, which the schema takes up to 4294967295. -1 is the
// gateway's "no credentials" ((uid_t)-1 is no process's uid) and is
// nobody.
func peerIs(peer int32, uid int64) bool {
	return peer != -1 && int64(uint32(peer)) == uid
}

// userForUID is the user whose users.<name>.uid is uid, if any.
func (sn *snapshot) userForUID(uid int32) (string, bool) {
	users, _ := sn.doc["users"].(map[string]any)
	for name, v := range users {
		entry, _ := v.(map[string]any)
		if u, ok := entry["uid"].(int64); ok && peerIs(uid, u) {
			return name, true
		}
	}
	return "", false
}

// userExists reports whether users.<name> exists.
func (sn *snapshot) userExists(name string) bool {
	_, ok := sn.doc["users"].(map[string]any)[name].(map[string]any)
	return ok
}

// stringList reads a canonical array of strings.
func stringList(v any) []string {
	items, _ := v.([]any)
	out := make([]string, 0, len(items))
	for _, it := range items {
		if s, ok := it.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
