package gateway

import (
	"context"
	"encoding/json"
	"sort"
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
	call   func(g *Gateway, ctx context.Context, cs *connState, params json.RawMessage) (any, error)
}

// methods is the routing table. Adding a socket method is one row here plus
// its handler; capabilities lists exactly these names.
var methods = map[string]method{
	"initialize": {preInit: true, inline: true, call: (*Gateway).initialize},
	"status":     {call: (*Gateway).status},
	"health":     {inline: true, call: (*Gateway).health},

	"session/new":      {call: (*Gateway).sessionNew},
	"session/prompt":   {call: (*Gateway).sessionPrompt},
	"session/cancel":   {call: (*Gateway).sessionCancel},
	"session/approve":  {call: (*Gateway).sessionApprove},
	"session/state":    {call: (*Gateway).sessionState},
	"session/messages": {call: (*Gateway).sessionMessages},
	"session/list":     {call: (*Gateway).sessionList},
	"session/close":    {call: (*Gateway).sessionClose},
	"session/kill":     {call: (*Gateway).sessionKill},
	"session/delete":   {call: (*Gateway).sessionDelete},

	"config/get":      {call: (*Gateway).configGet},
	"config/set":      {call: (*Gateway).configSet},
	"config/set-many": {call: (*Gateway).configSetMany},
	"config/list":     {call: (*Gateway).configList},
	"config/delete":   {call: (*Gateway).configDelete},

	"plugins/list": {call: (*Gateway).pluginsList},
}

// methodNames is the sorted list of methods served: initialize's
// capabilities.
func methodNames() []string {
	names := make([]string, 0, len(methods))
	for name := range methods {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
