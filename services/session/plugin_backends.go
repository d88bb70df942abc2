package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
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

// sandboxError keeps a sandbox refusal's message, not its transport.
func sandboxError(err error) error {
	if st, ok := status.FromError(err); ok {
		return errors.New(st.Message())
	}
	return err
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
	_, err := s.memory().MemoryStore(ctx, &pluginv1.MemoryStoreRequest{Plugin: a.Plugin,
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
	resp, err := s.memory().MemoryRecall(ctx, &pluginv1.MemoryRecallRequest{Plugin: a.Plugin, Query: a.Query, Limit: a.Limit})
	if err != nil {
		return toolOutput{}, sandboxError(err)
	}
	return recallAnswer(ctx, resp.GetEntries(), MaxLiveToolOutputBytes)
}

// recallAnswer is the recall tool's output, the entries as a JSON array
// of {"key","content","category"} (category left out when empty): the
// bytes json.Marshal writes, built with jsonstr, at most about room of
// them, and the size of the whole answer.
//
// A plugin may answer up to the sandbox's 16 MiB message, and as JSON a
// control character is six bytes: the whole answer was built, 96 MiB of
// it, to be cut at once to the 1 MiB its tool_result update carries (and
// the 16 KiB the transcript keeps). Three recalled memories of 1 MiB of
// them built 18 MiB (TestRecallAnswerIsBuiltOnlyAsFarAsItIsShown). Only
// the start every reader takes is built: the whole is measured
// (jsonstr.Len, which writes nothing) for the output_bytes and the
// truncation note the client is given, the same as a whole answer's.
// Room is a bound on bytes as written, and a reader's bound on them as
// JSON is never shorter, so cutting the start gives the bytes cutting the
// whole would. ctx is checked between entries: a caller that went away
// stops the building.
func recallAnswer(ctx context.Context, entries []*pluginv1.MemoryEntry, room int) (toolOutput, error) {
	const (
		keyField      = `{"key":`
		contentField  = `,"content":`
		categoryField = `,"category":`
	)
	size := len("[]")
	for i, e := range entries {
		if err := ctx.Err(); err != nil {
			return toolOutput{}, fmt.Errorf("recall answer: %w", err)
		}
		if i > 0 {
			size++
		}
		size += len(keyField) + jsonstr.Len(e.GetKey()) + len(contentField) + jsonstr.Len(e.GetContent()) + len("}")
		if c := e.GetCategory(); c != "" {
			size += len(categoryField) + jsonstr.Len(c)
		}
	}
	b := cutBuilder{out: make([]byte, 0, min(size, room)), room: room}
	b.raw("[")
	for i, e := range entries {
		if b.full() {
			break
		}
		if err := ctx.Err(); err != nil {
			return toolOutput{}, fmt.Errorf("recall answer: %w", err)
		}
		if i > 0 {
			b.raw(",")
		}
		b.raw(keyField)
		b.str(e.GetKey())
		b.raw(contentField)
		b.str(e.GetContent())
		if c := e.GetCategory(); c != "" {
			b.raw(categoryField)
			b.str(c)
		}
		b.raw("}")
	}
	b.raw("]")
	// b.out is never written again: the string shares it rather than
	// copy what may be a MiB.
	return toolOutput{text: unsafe.String(unsafe.SliceData(b.out), len(b.out)), total: size}, nil
}

// cutBuilder writes JSON up to room bytes: what passes room is left out,
// and a string is cut at a character, so out is always the start of what
// writing it all would make, at most room bytes (room less up to five
// when an escape did not fit).
type cutBuilder struct {
	out  []byte
	room int
}

func (b *cutBuilder) full() bool { return len(b.out) >= b.room }

// raw appends s as it is, as much of it as fits.
func (b *cutBuilder) raw(s string) {
	b.out = append(b.out, s[:min(len(s), max(0, b.room-len(b.out)))]...)
}

// str appends s as a JSON string, as much of it as fits.
func (b *cutBuilder) str(s string) {
	left := b.room - len(b.out)
	if left <= 0 {
		return
	}
	// Fit stops at left: a long string is not measured whole again.
	if fit, _ := jsonstr.Fit(s, left-2); fit == len(s) {
		b.out = jsonstr.Append(b.out, s)
		return
	}
	// The opening quote and the part that fits; no closing quote, which
	// the whole string would have written only after the rest.
	fit, _ := jsonstr.Fit(s, left-1)
	b.out = jsonstr.Append(b.out, s[:fit])
	b.out = b.out[:len(b.out)-1]
	// Nothing after a cut string: the bytes left would not follow it in
	// the whole.
	b.room = len(b.out)
}

func (s *Server) memoryForget(ctx context.Context, args json.RawMessage) (string, error) {
	var a struct {
		Key, Plugin string
	}
	if err := decodeArgs(args, &a); err != nil {
		return "", err
	}
	resp, err := s.memory().MemoryForget(ctx, &pluginv1.MemoryForgetRequest{Plugin: a.Plugin, Key: a.Key})
	if err != nil {
		return "", sandboxError(err)
	}
	if !resp.GetExisted() {
		return "no memory under " + a.Key, nil
	}
	return "forgot " + a.Key, nil
}

// memory is the sandbox client memory calls go to.
func (s *Server) memory() pluginv1.PluginServiceClient {
	if s.cfg.Memory != nil {
		return s.cfg.Memory
	}
	return s.cfg.Plugins
}
