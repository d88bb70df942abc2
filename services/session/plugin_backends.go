package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// Tools backed by the plugin sandbox's other worlds: skill bundles
// (plugin:<plugin>/<skill>) and memory plugins as a storage backend. They
// are offered only when the sandbox reports something behind them at the
// turn's start (ListTools' skill_count and memory_plugins), and, like any
// tool, only to agents whose tools list allows them.
const (
	toolSkillList    = "plugin_skills"
	toolSkillRead    = "plugin_skill_read"
	toolMemoryStore  = "plugin_memory_store"
	toolMemoryRecall = "plugin_memory_recall"
	toolMemoryForget = "plugin_memory_forget"
)

// addPluginBackends adds the skill and memory tools to a turn's tool set.
func (s *Server) addPluginBackends(ts *toolSet, agent AgentConfig, listed *pluginv1.ListToolsResponse) {
	add := func(name, desc, params string, run func(ctx context.Context, args json.RawMessage) (toolOutput, error)) {
		if !agent.offers(name) {
			return
		}
		ts.builtin[name] = builtinTool{spec: ToolSpec{Name: name, Description: desc, Parameters: json.RawMessage(params)}, run: run}
	}
	if listed.GetSkillCount() > 0 {
		add(toolSkillList, "Lists the skills of installed skill bundles: id and description.",
			`{"type":"object","properties":{}}`, whole(s.skillList))
		add(toolSkillRead, "Reads a skill's SKILL.md (or another file of its folder, by relative path).",
			`{"type":"object","properties":{"id":{"type":"string"},"path":{"type":"string"}},"required":["id"]}`, whole(s.skillRead))
	}
	if len(listed.GetMemoryPlugins()) > 0 {
		add(toolMemoryStore, "Stores a memory under a key, in the memory plugin.",
			`{"type":"object","properties":{"key":{"type":"string"},"content":{"type":"string"},"category":{"type":"string"},"plugin":{"type":"string"}},"required":["key","content"]}`, whole(s.memoryStore))
		add(toolMemoryRecall, "Recalls the memories matching a query, best first.",
			`{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"},"plugin":{"type":"string"}},"required":["query"]}`, s.memoryRecall)
		add(toolMemoryForget, "Forgets the memory stored under a key.",
			`{"type":"object","properties":{"key":{"type":"string"},"plugin":{"type":"string"}},"required":["key"]}`, whole(s.memoryForget))
	}
}

// sandboxUnavailable is what a call that did not reach the sandbox
// says, as execute's for a plugin tool.
const sandboxUnavailable = "plugin sandbox unavailable"

// sandboxError keeps a sandbox refusal's message, not its transport. A
// call that did not reach the sandbox (Unavailable from the client's
// side: a connection lost, a sandbox that left a health check on its
// connection unanswered (stopped or hung), or no replica reachable,
// rpcerr.ReasonDependency) names it: the words of
// gRPC's transport alone do not say what was away. The sandbox's own
// Unavailable answers (rpcerr.ReasonCapacity) are its words already.
func sandboxError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	if reason, _ := rpcerr.Details(st); st.Code() == codes.Unavailable && reason != rpcerr.ReasonCapacity && !strings.HasPrefix(msg, sandboxUnavailable) {
		msg = sandboxUnavailable + ": " + msg
	}
	return errors.New(msg)
}

func decodeArgs(args json.RawMessage, v any) error {
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if err := json.Unmarshal(args, v); err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	return nil
}

func (s *Server) skillList(ctx context.Context, _ json.RawMessage) (string, error) {
	resp, err := s.cfg.Plugins.ListSkills(ctx, &pluginv1.ListSkillsRequest{})
	if err != nil {
		return "", sandboxError(err)
	}
	var b strings.Builder
	for _, sk := range resp.GetSkills() {
		fmt.Fprintf(&b, "%s: %s\n", sk.GetId(), sk.GetDescription())
	}
	return b.String(), nil
}

func (s *Server) skillRead(ctx context.Context, args json.RawMessage) (string, error) {
	var a struct {
		ID   string `json:"id"`
		Path string `json:"path"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	resp, err := s.cfg.Plugins.ReadSkill(ctx, &pluginv1.ReadSkillRequest{Id: a.ID, Path: a.Path})
	if err != nil {
		return "", sandboxError(err)
	}
	return resp.GetContent(), nil
}

func (s *Server) memoryStore(ctx context.Context, args json.RawMessage) (string, error) {
	var a struct {
		Key, Content, Category, Plugin string
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	_, err := s.cfg.Plugins.MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Plugin: a.Plugin,
		Entry: &pluginv1.MemoryEntry{Key: a.Key, Content: a.Content, Category: a.Category}})
	if err != nil {
		return "", sandboxError(err)
	}
	return "stored " + a.Key, nil
}

func (s *Server) memoryRecall(ctx context.Context, args json.RawMessage) (toolOutput, error) {
	var a struct {
		Query, Plugin string
		Limit         int32
	}
	if err := decodeArgs(args, &a); err != nil {
		return toolOutput{}, err
	}
	// The sandbox is sent the room the client is shown, and answers only
	// that start with the whole's size: answered as entries, a recall of
	// up to the sandbox's 16 MiB message crossed the socket whole to be
	// cut here to MaxLiveToolOutputBytes. A sandbox older than
	// answer_limit still answers entries (answer_bytes zero), which are
	// built here only as far as they are shown.
	resp, err := s.cfg.Plugins.MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Plugin: a.Plugin, Query: a.Query, Limit: a.Limit,
		AnswerLimit: MaxLiveToolOutputBytes})
	if err != nil {
		return toolOutput{}, sandboxError(err)
	}
	if n := resp.GetAnswerBytes(); n > 0 {
		return recallReply(resp.GetAnswer(), n), nil
	}
	return recallAnswer(ctx, resp.GetEntries(), MaxLiveToolOutputBytes)
}

// recallReply is the output of a sandbox's own answer (its start, text,
// and the whole's size, total). What a sandbox sends is not trusted to
// keep to the room it was given: a longer text is cut here at a
// character, as the transcript and the update would cut it, and a size
// below the text's is the text's.
func recallReply(text string, total int64) toolOutput {
	if len(text) > MaxLiveToolOutputBytes {
		fit, _ := jsonstr.Fit(text, MaxLiveToolOutputBytes)
		text = text[:fit]
	}
	return toolOutput{text: text, total: int(min(max(total, int64(len(text))), math.MaxInt32))}
}

// recallAnswer is the recall tool's output built here from a sandbox's
// entries (recallanswer.Build): at most about room bytes of it, and the
// size of the whole answer (TestRecallAnswerIsBuiltOnlyAsFarAsItIsShown).
func recallAnswer(ctx context.Context, entries []*pluginv1.MemoryEntry, room int) (toolOutput, error) {
	text, total, err := recallanswer.Build(ctx, entries, room)
	if err != nil {
		return toolOutput{}, err
	}
	return toolOutput{text: text, total: total}, nil
}

func (s *Server) memoryForget(ctx context.Context, args json.RawMessage) (string, error) {
	var a struct {
		Key, Plugin string
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	resp, err := s.cfg.Plugins.MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Plugin: a.Plugin, Key: a.Key})
	if err != nil {
		return "", sandboxError(err)
	}
	if !resp.GetExisted() {
		return "no memory under " + a.Key, nil
	}
	return "forgot " + a.Key, nil
}
