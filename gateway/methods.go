package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"sort"

	"github.com/clawmesh/clawmesh/internal/configschema"
)

// method is one row of the routing table: a socket method name and the
// handler that serves it (usually one gRPC call to one service).
type method struct {
	// preInit methods may be called before initialize.
	preInit bool
	// inline methods run on the connection's read loop, in order: initialize,
	// so a pipelined request after it sees its binding, and methods that
	// answer from memory without blocking, which saves a goroutine handoff.
	inline bool
	// needs lists the permissions of which a principal must hold one for
	// the method to be listed in its capabilities (none: everyone's). The
	// service still decides every call.
	needs []string
	call  func(g *Gateway, ctx context.Context, cs *connState, params json.RawMessage) (any, error)
}

// Permission sets of the method table.
var (
	needsAgent      = []string{configschema.PermAgentUse}
	needsConfigRead = []string{configschema.PermConfigRead, configschema.PermConfigUpdate}
	needsConfigEdit = []string{configschema.PermConfigUpdate}
	needsFiles      = []string{configschema.PermFilesCreate}
)

// methods is the routing table. Adding a socket method is one row here plus
// its handler; capabilities lists exactly these names.
var methods map[string]method

// The table is filled at init: initialize lists capabilities from it.
func init() { methods = methodTable() }

func methodTable() map[string]method {
	return map[string]method{
		"initialize": {preInit: true, inline: true, call: (*Gateway).initialize},
		"status":     {call: (*Gateway).status},
		"health":     {inline: true, call: (*Gateway).health},

		"session/new":      {needs: needsAgent, call: (*Gateway).sessionNew},
		"session/prompt":   {needs: needsAgent, call: (*Gateway).sessionPrompt},
		"session/cancel":   {needs: needsAgent, call: (*Gateway).sessionCancel},
		"session/approve":  {needs: needsAgent, call: (*Gateway).sessionApprove},
		"session/state":    {needs: needsAgent, call: (*Gateway).sessionState},
		"session/messages": {needs: needsAgent, call: (*Gateway).sessionMessages},
		"session/list":     {needs: needsAgent, call: (*Gateway).sessionList},
		"session/close":    {needs: needsAgent, call: (*Gateway).sessionClose},
		"session/kill":     {needs: needsAgent, call: (*Gateway).sessionKill},
		"session/delete":   {needs: needsAgent, call: (*Gateway).sessionDelete},

		"config/get":      {needs: needsConfigRead, call: (*Gateway).configGet},
		"config/set":      {needs: needsConfigEdit, call: (*Gateway).configSet},
		"config/set-many": {needs: needsConfigEdit, call: (*Gateway).configSetMany},
		"config/list":     {needs: needsConfigRead, call: (*Gateway).configList},
		"config/delete":   {needs: needsConfigEdit, call: (*Gateway).configDelete},

		"plugins/list": {needs: []string{configschema.PermPluginsManage}, call: (*Gateway).pluginsList},

		"file/attach":        {needs: needsFiles, call: (*Gateway).fileAttach},
		"file/upload/begin":  {needs: needsFiles, call: (*Gateway).uploadBegin},
		"file/upload/chunk":  {needs: needsFiles, call: (*Gateway).uploadChunk},
		"file/upload/commit": {needs: needsFiles, call: (*Gateway).uploadCommit},
	}
}

// capabilitiesFor is the sorted list of the methods a principal holding
// perms may call: initialize's capabilities.
func capabilitiesFor(perms []string) []string {
	names := make([]string, 0, len(methods))
	for name, m := range methods {
		if len(m.needs) == 0 || slices.ContainsFunc(m.needs, func(p string) bool { return slices.Contains(perms, p) }) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}
