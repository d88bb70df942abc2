package session

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/grpcclient"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// builtinTool is a tool the session service runs itself, so turns with
// tools work before any plugin is installed.
type builtinTool struct {
	spec ToolSpec
	run  func(ctx context.Context, args json.RawMessage) (toolOutput, error)
}

// toolOutput is a tool's output as a turn is given it: text, the whole
// output, or only its start when total is larger. A tool whose output may
// be far past what anyone is shown builds only the start (recallAnswer);
// the client is still told the whole one's size and where it was cut.
type toolOutput struct {
	text  string
	total int
}

// wholeOutput is an output built whole.
func wholeOutput(s string) toolOutput { return toolOutput{text: s} }

// size is the bytes of the whole output.
func (o toolOutput) size() int { return max(o.total, len(o.text)) }

// whole is run as a tool whose output is built whole.
func whole(run func(context.Context, json.RawMessage) (string, error)) func(context.Context, json.RawMessage) (toolOutput, error) {
	return func(ctx context.Context, args json.RawMessage) (toolOutput, error) {
		out, err := run(ctx, args)
		return wholeOutput(out), err
	}
}

var builtins = map[string]builtinTool{
	"echo": {
		spec: ToolSpec{
			Name:        "echo",
			Description: "Returns its arguments unchanged, as JSON text.",
			Parameters:  json.RawMessage(`{"type":"object","additionalProperties":true}`),
		},
		run: whole(func(_ context.Context, args json.RawMessage) (string, error) { return string(args), nil }),
	},
}

// toolSet is what one turn may call: the built-ins, then the plugin
// sandbox's tools (a built-in wins a name clash), filtered by the agent's
// tools list.
type toolSet struct {
	builtin map[string]builtinTool
	plugin  map[string]*pluginv1.Tool
	// refused are the tools that exist but the agent's tools list leaves
	// out: a call of one is refused by policy, not unknown.
	refused map[string]bool
}

// toolsFor lists the tools of a turn. A plugin sandbox that is missing,
// not built yet or failing means no plugin tools, never a failed turn;
// unlisted is then what the turn's client is told (noPluginTools), ""
// when the plugin tools were listed or there is no sandbox.
func (s *Server) toolsFor(ctx context.Context, agent AgentConfig) (ts *toolSet, unlisted string) {
	ts = &toolSet{builtin: map[string]builtinTool{}, plugin: map[string]*pluginv1.Tool{}, refused: map[string]bool{}}
	for name, b := range builtins {
		if agent.offers(name) {
			ts.builtin[name] = b
		} else {
			ts.refused[name] = true
		}
	}
	if s.cfg.Plugins == nil {
		return ts, ""
	}
	listCtx, cancel := context.WithTimeout(ctx, s.cfg.PluginListTimeout)
	defer cancel()
	// The sandbox's client (grpcclient.DialReplicas) waits within the
	// bound for a replica that serves: a sandbox the launcher restarts
	// is away 0.2 to 1.8 s (first to fifth crash in a row), and a
	// prompt sent meanwhile ran its turn without the plugin tools. One
	// gone for good (every replica away for grpcclient.RestartGrace)
	// fails at once, so the bound is paid only in the grace; one hung
	// (connected, answering nothing) once a listing has found it so,
	// until it answers again.
	resp, err := s.listPluginTools(listCtx)
	if err != nil {
		if ctx.Err() != nil {
			// The turn is ending: nobody is left to tell.
			return ts, ""
		}
		if c := status.Code(err); c != codes.Unimplemented && c != codes.Unavailable {
			s.log.Warn("list plugin tools", zap.Error(err))
		}
		return ts, noPluginTools(err, s.cfg.PluginListTimeout)
	}
	s.addPluginBackends(ts, agent, resp)
	for _, t := range resp.GetTools() {
		if _, clash := ts.builtin[t.GetName()]; clash {
			continue
		}
		if agent.offers(t.GetName()) {
			ts.plugin[t.GetName()] = t
		} else {
			ts.refused[t.GetName()] = true
		}
	}
	return ts, ""
}

// listPluginTools is the sandbox's ListTools, made again while it fails
// Unavailable on its own (grpcclient.ReadAgain, as the gateway's
// plugins/list): a call picked on the connection of a sandbox killed a
// moment before, which the client had not yet seen close, fails at
// once; so does one ended because its replica is stopped or hung
// (grpcclient.NotAnswering), which another replica may answer. Tried
// once more only, with every replica killed at once both tries could
// meet a dead connection, and the turn was told "it is unavailable"
// where no replica could be reached. The tries after wait for the
// restarted sandbox like any call, and fail at once when every replica
// is hung.
func (s *Server) listPluginTools(ctx context.Context) (*pluginv1.ListToolsResponse, error) {
	var last error
	return grpcclient.ReadAgain(ctx, s.cfg.PluginReplicas, func() (*pluginv1.ListToolsResponse, error) {
		if last != nil {
			s.log.Info("list plugin tools: tried again", zap.Error(last))
		}
		resp, err := s.cfg.Plugins.ListTools(ctx, &pluginv1.ListToolsRequest{})
		last = err
		return resp, err
	})
}

// stoppedOrHung is why a call or a listing failed when the sandbox took
// it, or a health check on its connection, and answered nothing
// (grpcclient.NotAnswering).
const stoppedOrHung = "it did not answer: it is stopped or hung"

// noPluginTools is what a turn's client is told, as the turn's first
// thought chunk, when the sandbox did not list its tools (err, the
// listing's): that the turn has none, and why in a few words. The
// status's own message, which may name the daemon's socket paths, is
// left to the log and to plugins/list.
func noPluginTools(err error, bound time.Duration) string {
	st := status.Convert(err)
	var why string
	switch {
	case grpcclient.NotAnswering(err):
		why = stoppedOrHung
	case grpcclient.Unreachable(err):
		why = "it cannot be reached (no replica is reachable)"
	case grpcclient.Unserved(err):
		why = fmt.Sprintf("it is starting or restarting and did not serve within %v", bound)
	case st.Code() == codes.DeadlineExceeded:
		why = fmt.Sprintf("it did not answer within %v", bound)
	case st.Code() == codes.Unimplemented:
		why = "it does not serve plugin tools"
	case st.Code() == codes.Unavailable:
		why = "it is unavailable"
	default:
		why = "it failed to list them"
	}
	return "[No plugin tools in this turn: the plugin sandbox could not list them: " + why + ".]"
}

func (ts *toolSet) has(name string) bool {
	_, b := ts.builtin[name]
	_, p := ts.plugin[name]
	return b || p
}

// specs lists the tools for the provider, by name.
func (ts *toolSet) specs() []ToolSpec {
	var out []ToolSpec
	for _, b := range ts.builtin {
		out = append(out, b.spec)
	}
	for _, t := range ts.plugin {
		params := json.RawMessage(t.GetParametersSchemaJson())
		if !json.Valid(params) {
			params = json.RawMessage(`{"type":"object"}`)
		}
		out = append(out, ToolSpec{Name: t.GetName(), Description: t.GetDescription(), Parameters: params})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// execute runs one call and returns its output and whether it succeeded.
// Failures of the tool or of the sandbox are a failed result; the turn
// goes on.
func (s *Server) execute(ctx context.Context, ts *toolSet, p *commonv1.Principal, sessionID, callID, name string, args json.RawMessage) (toolOutput, bool) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ToolTimeout)
	defer cancel()
	if b, ok := ts.builtin[name]; ok {
		out, err := b.run(ctx, args)
		if err != nil {
			return wholeOutput(err.Error()), false
		}
		return out, true
	}
	// The sandbox is sent the bytes the client is shown and answers only
	// them, with the whole's size (output_bytes): an output of up to the
	// host's 16 MiB result crossed the socket whole to be cut here. A
	// sandbox older than output_limit answers the output whole.
	resp, err := s.cfg.Plugins.ExecuteTool(ctx, &pluginv1.ExecuteToolRequest{
		Principal: p, ToolName: name, ArgumentsJson: string(args), SessionId: sessionID, ToolCallId: callID,
		OutputLimit: MaxLiveToolOutputBytes,
	})
	if err != nil {
		st := status.Convert(err)
		switch st.Code() {
		case codes.Canceled:
			return wholeOutput("Tool call cancelled"), false
		case codes.DeadlineExceeded:
			return wholeOutput(fmt.Sprintf("Tool %s timed out", name)), false
		case codes.Internal, codes.Unknown, codes.Unavailable:
			if grpcclient.NotAnswering(err) {
				// Said, as the turn's notice says it, in words that
				// name no socket: the model and the client may retry
				// once the sandbox runs again.
				return wholeOutput(fmt.Sprintf("Tool %s failed: %s: %s", name, sandboxUnavailable, stoppedOrHung)), false
			}
			return wholeOutput(fmt.Sprintf("Tool %s failed: %s", name, sandboxUnavailable)), false
		}
		return wholeOutput(fmt.Sprintf("Tool %s failed: %s", name, st.Message())), false
	}
	out, total := resp.GetOutput(), int(min(resp.GetOutputBytes(), math.MaxInt32))
	if len(out) > MaxLiveToolOutputBytes {
		// Kept to the room sent, whatever a sandbox answers.
		out = tooloutput.Start(out, MaxLiveToolOutputBytes)
		total = max(total, len(resp.GetOutput()))
	}
	if !resp.GetSuccess() {
		if msg := resp.GetError(); msg != "" {
			return wholeOutput(fmt.Sprintf("Tool %s failed: %s", name, msg)), false
		}
		failed := fmt.Sprintf("Tool %s failed: ", name)
		return toolOutput{text: failed + out, total: len(failed) + max(total, len(out))}, false
	}
	return toolOutput{text: out, total: total}, true
}
