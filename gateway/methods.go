package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"time"

	"github.com/clawmesh/clawmesh/gateway/jsonrpc"
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
	// paramsDone says the call keeps nothing of its params once it has
	// returned (jsonrpc.Options.ParamsDone): its frame's memory goes to
	// the next large frame. Only for methods whose frames are large and
	// many, and whose handler was read for it: a slice of the params kept
	// past the call would see a later frame's bytes.
	paramsDone bool
	// urgent methods end or unblock other requests of the connection (a
	// turn's prompt): read and served past the connection's in-flight
	// bound (jsonrpc.Options.Urgent), since a client that filled the
	// bound with prompts can free it only with them.
	urgent bool
	// needs lists the permissions of which a principal must hold one for
	// the method to be listed in its capabilities (none: everyone's). The
	// service still decides every call.
	needs []string
	// kind sets the deadline of the method's calls (route applies it; a
	// method served later gets it as a time, see later).
	kind callKind
	call func(g *Gateway, ctx context.Context, cs *connState, params json.RawMessage) (any, error)
	// large says a reply may be megabytes (a transcript page, the whole
	// config document): at most maxLargeReads such calls run at once,
	// gateway-wide (see Gateway.largeReads).
	large bool
	// later, set instead of call, serves a method without a goroutine of
	// its own (jsonrpc.DeferredHandler): it is called on the read loop (or
	// on the goroutine that frees room for a held request), must not
	// block, and answers through reply, once. The reads that many clients
	// repeat (status, session/state) are shared this way: the goroutine
	// that made a shared read answers every request it serves, and none
	// waits for it. How long it waits comes in wait, not in ctx: a
	// context with a deadline is a timer and two registrations a request,
	// where a shared read keeps one timer for all its callers and the
	// connection stands for all its requests (coalesce.Group.Go and
	// coalesce.Owner; a sixth of status's rate, docs/performance.md,
	// nineteenth round).
	later func(g *Gateway, ctx context.Context, wait laterWait, cs *connState, params json.RawMessage, reply jsonrpc.Reply)
}

// callKind says how long the gateway waits for what a method asks of the
// services. Every call the gateway makes has a deadline: a service that
// hangs gives the client an error, never silence.
type callKind int

const (
	// kindLocal methods answer from the gateway's memory.
	kindLocal callKind = iota
	// kindQuick is one short call: rpc.call_timeout_ms (default 10 s).
	kindQuick
	// kindSlow calls may queue on a lock or move much data (config
	// writes wait for the config write lock, session/new makes a
	// workspace, session/messages reads a whole transcript): three times
	// rpc.call_timeout_ms (30 s by default).
	kindSlow
	// kindTurn is session/prompt, which lasts as long as its turn: the
	// turn bounds itself (agents.*.timeout_secs for each provider wait,
	// approval_timeout_secs for each approval), and a session service
	// that stops answering fails the call through the connection's
	// keepalive (grpcclient.KeepaliveTime + KeepaliveTimeout, 15 s).
	kindTurn
)

// slowFactor is how many times rpc.call_timeout_ms a kindSlow call gets.
const slowFactor = 3

// deadline of a method of kind k; 0 for none of the clock's.
func (g *Gateway) deadline(k callKind) time.Duration {
	switch k {
	case kindQuick:
		return g.limits.CallTimeout
	case kindSlow:
		return slowFactor * g.limits.CallTimeout
	}
	return 0
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
		"initialize": {preInit: true, inline: true, kind: kindQuick, call: (*Gateway).initialize},
		"status":     {kind: kindQuick, later: (*Gateway).status},
		"health":     {inline: true, kind: kindLocal, call: (*Gateway).health},

		"session/new":      {needs: needsAgent, kind: kindSlow, call: (*Gateway).sessionNew},
		"session/prompt":   {needs: needsAgent, kind: kindTurn, call: (*Gateway).sessionPrompt},
		"session/cancel":   {needs: needsAgent, urgent: true, kind: kindQuick, call: (*Gateway).sessionCancel},
		"session/approve":  {needs: needsAgent, urgent: true, kind: kindQuick, call: (*Gateway).sessionApprove},
		"session/state":    {needs: needsAgent, kind: kindQuick, later: (*Gateway).sessionState},
		"session/messages": {needs: needsAgent, kind: kindSlow, call: (*Gateway).sessionMessages, large: true},
		"session/list":     {needs: needsAgent, kind: kindQuick, call: (*Gateway).sessionList},
		"session/close":    {needs: needsAgent, urgent: true, kind: kindQuick, call: (*Gateway).sessionClose},
		"session/kill":     {needs: needsAgent, urgent: true, kind: kindQuick, call: (*Gateway).sessionKill},
		"session/delete":   {needs: needsAgent, kind: kindSlow, call: (*Gateway).sessionDelete},

		"config/get":      {needs: needsConfigRead, kind: kindQuick, call: (*Gateway).configGet, large: true},
		"config/set":      {needs: needsConfigEdit, kind: kindSlow, call: (*Gateway).configSet},
		"config/set-many": {needs: needsConfigEdit, kind: kindSlow, call: (*Gateway).configSetMany},
		"config/list":     {needs: needsConfigRead, kind: kindQuick, call: (*Gateway).configList, large: true},
		"config/delete":   {needs: needsConfigEdit, kind: kindSlow, call: (*Gateway).configDelete},

		"plugins/list": {needs: []string{configschema.PermPluginsManage}, kind: kindQuick, call: (*Gateway).pluginsList},

		"file/attach":        {needs: needsFiles, kind: kindSlow, call: (*Gateway).fileAttach},
		"file/upload/begin":  {needs: needsFiles, kind: kindQuick, call: (*Gateway).uploadBegin},
		"file/upload/chunk":  {needs: needsFiles, kind: kindQuick, paramsDone: true, call: (*Gateway).uploadChunk},
		"file/upload/commit": {needs: needsFiles, kind: kindSlow, call: (*Gateway).uploadCommit},
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
