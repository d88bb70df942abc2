package session

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/testwait"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// backendSandbox is a sandbox over real gRPC with one skill and a memory
// plugin (a map); the real RPCs are tested in pluginsandbox and e2e.
type backendSandbox struct {
	pluginv1.UnimplementedPluginServiceServer
	mu  sync.Mutex
	mem map[string]string
}

func (*backendSandbox) ListTools(context.Context, *pluginv1.ListToolsRequest) (*pluginv1.ListToolsResponse, error) {
	return &pluginv1.ListToolsResponse{MemoryPlugins: []string{"kv"}, SkillCount: 1}, nil
}

func (*backendSandbox) ListSkills(context.Context, *pluginv1.ListSkillsRequest) (*pluginv1.ListSkillsResponse, error) {
	return &pluginv1.ListSkillsResponse{Skills: []*pluginv1.Skill{{Id: "plugin:toolkit/review", Description: "Reviews."}}}, nil
}

func (*backendSandbox) ReadSkill(_ context.Context, req *pluginv1.ReadSkillRequest) (*pluginv1.ReadSkillResponse, error) {
	if req.GetId() != "plugin:toolkit/review" {
		return nil, status.Error(codes.NotFound, "Unknown skill `"+req.GetId()+"`")
	}
	return &pluginv1.ReadSkillResponse{Id: req.GetId(), Content: "# Review steps"}, nil
}

func (b *backendSandbox) MemoryStore(_ context.Context, req *pluginv1.MemoryStoreRequest) (*pluginv1.MemoryStoreResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mem[req.GetEntry().GetKey()] = req.GetEntry().GetContent()
	return &pluginv1.MemoryStoreResponse{}, nil
}

func (b *backendSandbox) MemoryRecall(_ context.Context, req *pluginv1.MemoryRecallRequest) (*pluginv1.MemoryRecallResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &pluginv1.MemoryRecallResponse{}
	for k, v := range b.mem {
		if strings.Contains(v, req.GetQuery()) {
			resp.Entries = append(resp.Entries, &pluginv1.MemoryEntry{Key: k, Content: v})
		}
	}
	return resp, nil
}

// The session service reads skills and uses a memory plugin through the
// sandbox, as tools of a turn.
func TestPluginSkillAndMemoryTools(t *testing.T) {
	client := pluginClient(t, serveSandbox(t, &backendSandbox{mem: map[string]string{}}))
	h := newHarness(t, func(c *Config) { c.Plugins = client })
	id := h.newSession(alice, "default")
	rec := h.record(id)
	resp := h.prompt(alice, id, `/tool plugin_skills`+"\n"+`/tool plugin_skill_read {"id":"plugin:toolkit/review"}`+"\n"+
		`/tool plugin_skill_read {"id":"plugin:toolkit/nope"}`+"\n"+
		`/tool plugin_memory_store {"key":"k1","content":"the sky is blue"}`+"\n"+`/tool plugin_memory_recall {"query":"blue"}`+"\n/say end")
	if resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("prompt %v", resp)
	}
	var got []string
	for _, u := range rec.until(UpdateTurnComplete) {
		if u.Type == UpdateToolResult {
			got = append(got, u.str("status")+": "+u.str("raw_output"))
		}
	}
	want := []string{
		toolCompleted + ": plugin:toolkit/review: Reviews.\n",
		toolCompleted + ": # Review steps",
		toolFailed + ": Unknown skill `plugin:toolkit/nope`",
		toolCompleted + ": stored k1",
		toolCompleted + `: [{"key":"k1","content":"the sky is blue"}]`,
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("results\n%q\nwant\n%q", got, want)
	}
}

// A tool's output went whole into its tool_result update: a recall of
// three memories of 1 MiB of control characters is some 60 MiB as the
// update's JSON, past the bus's 8 MiB message, so the update was refused
// and the client saw a gap where the result was. The update carries at
// most MaxLiveToolOutputBytes of it (as JSON), and says it was cut.
func TestLargeToolOutputStillReachesTheClient(t *testing.T) {
	ctrl := strings.Repeat("\x01", 1<<20)
	sb := &backendSandbox{mem: map[string]string{"a": ctrl, "b": ctrl, "c": ctrl}}
	h := newHarness(t, func(c *Config) { c.Plugins = pluginClient(t, serveSandbox(t, sb)) })
	id := h.newSession(alice, "default")
	rec := h.record(id)
	// The turn moves 3 MiB through gRPC and writes and measures 18 MiB of
	// JSON: on two cores at load 40, under -race, that took past the
	// harness's 15 s for a prompt even once the answer was built by
	// jsonstr (one run in a package run). It has the bound the tests give
	// a wait on a loaded machine.
	resp := h.promptWithin(alice, id, `/tool plugin_memory_recall {"query":"\u0001"}`+"\n/say end", testwait.Bound)
	if resp.GetOutcome() != outcomeEnum[OutcomeCompleted] {
		t.Fatalf("prompt %v", resp)
	}
	us := rec.until(UpdateTurnComplete)
	checkSeq(t, us)
	var out string
	for _, u := range us {
		if u.Type == UpdateToolResult {
			out = u.str("raw_output")
		}
	}
	if n := len(jsonstr.Append(nil, out)); n > MaxLiveToolOutputBytes || !strings.Contains(out, "[tool output truncated: ") {
		t.Fatalf("tool_result's raw_output: %d bytes as JSON, ends %q", n, out[max(0, len(out)-80):])
	}
}

// The recall tool's answer is the bytes json.Marshal wrote for the
// entries, escapes and an empty category's omission included.
func TestRecallAnswerIsEncodingJSONs(t *testing.T) {
	type entry struct {
		Key      string `json:"key"`
		Content  string `json:"content"`
		Category string `json:"category,omitempty"`
	}
	for _, entries := range [][]*pluginv1.MemoryEntry{
		nil,
		{{Key: "k1", Content: "the sky is blue"}},
		{{Key: "a\"b", Content: "\x01\n\t<tag>&\u2028\u2029\xff\\", Category: "c"}, {Key: "", Content: "", Category: ""}},
		{{Key: "k", Content: strings.Repeat("\x01é", 1000), Category: "notes"}, {Key: "k2", Content: "x"}},
	} {
		want := make([]entry, 0, len(entries))
		for _, e := range entries {
			want = append(want, entry{e.GetKey(), e.GetContent(), e.GetCategory()})
		}
		b, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if got := recallAnswer(entries); got != string(b) {
			t.Fatalf("recall answer\n%q\nwant\n%q", got, b)
		}
	}
}

// BenchmarkRecallAnswer builds the answer to a recall of three memories
// of 1 MiB of control characters (TestLargeToolOutputStillReachesTheClient's).
func BenchmarkRecallAnswer(b *testing.B) {
	ctrl := strings.Repeat("\x01", 1<<20)
	entries := []*pluginv1.MemoryEntry{{Key: "a", Content: ctrl}, {Key: "b", Content: ctrl}, {Key: "c", Content: ctrl}}
	b.ReportAllocs()
	for b.Loop() {
		_ = recallAnswer(entries)
	}
}
