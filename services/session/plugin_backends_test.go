package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clawmesh/clawmesh/internal/jsonstr"
	"github.com/clawmesh/clawmesh/internal/recallanswer"
	"github.com/clawmesh/clawmesh/internal/testwait"
	"github.com/clawmesh/clawmesh/internal/tooloutput"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
)

// backendSandbox is a sandbox over real gRPC with one skill and a memory
// plugin (a map); the real RPCs are tested in pluginsandbox and e2e.
type backendSandbox struct {
	pluginv1.UnimplementedPluginServiceServer
	mu  sync.Mutex
	mem map[string]string
	// old answers a recall with its entries whatever answer_limit says,
	// as a sandbox older than the field does.
	old bool
	// limits and replies are each recall's answer_limit and the size of
	// its reply as a gRPC message.
	limits, replies []int
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

func (b *backendSandbox) MemoryRecall(ctx context.Context, req *pluginv1.MemoryRecallRequest) (*pluginv1.MemoryRecallResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	resp := &pluginv1.MemoryRecallResponse{}
	for k, v := range b.mem {
		if strings.Contains(v, req.GetQuery()) {
			resp.Entries = append(resp.Entries, &pluginv1.MemoryEntry{Key: k, Content: v})
		}
	}
	// In one order, the keys': the map's differs from run to run, and a
	// test comparing the turn's answer with one built from a, b, c met
	// another order once (CI, the fifty-sixth round).
	slices.SortFunc(resp.Entries, func(x, y *pluginv1.MemoryEntry) int { return strings.Compare(x.GetKey(), y.GetKey()) })
	if room := int(req.GetAnswerLimit()); room > 0 && !b.old {
		// As the real sandbox answers (TestRecallAnswersOnlyWhatIsShown).
		text, total, err := recallanswer.Build(ctx, resp.Entries, room)
		if err != nil {
			return nil, err
		}
		resp = &pluginv1.MemoryRecallResponse{Answer: text, AnswerBytes: int64(total)}
	}
	b.limits, b.replies = append(b.limits, int(req.GetAnswerLimit())), append(b.replies, proto.Size(resp))
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
//
// The session service sends the room it shows with the recall
// (answer_limit), and a sandbox that knows the field answers only that
// start: the reply is bounded by it, not by the sandbox's 16 MiB message.
// One older than the field answers the entries, and the client sees the
// same either way (the fifty-seventh round).
func TestLargeToolOutputStillReachesTheClient(t *testing.T) {
	for _, old := range []bool{false, true} {
		t.Run(fmt.Sprintf("old=%v", old), func(t *testing.T) { largeRecallReachesTheClient(t, old) })
	}
}

func largeRecallReachesTheClient(t *testing.T, old bool) {
	ctrl := strings.Repeat("\x01", 1<<20)
	sb := &backendSandbox{mem: map[string]string{"a": ctrl, "b": ctrl, "c": ctrl}, old: old}
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
	// Built only as far as it is shown, the answer still tells the client
	// the whole one's size, in output_bytes and in the note, and its start
	// is the whole answer's.
	whole, err := recallAnswer(context.Background(), []*pluginv1.MemoryEntry{
		{Key: "a", Content: ctrl}, {Key: "b", Content: ctrl}, {Key: "c", Content: ctrl}}, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if u.Type != UpdateToolResult {
			continue
		}
		if got, _ := u.Params["output_bytes"].(float64); int(got) != len(whole.text) {
			t.Fatalf("output_bytes %v, want the whole answer's %d", u.Params["output_bytes"], len(whole.text))
		}
	}
	note := strings.LastIndex(out, "\n[tool output truncated: ")
	if note < 0 || !strings.HasSuffix(out, fmt.Sprintf(" of %d bytes shown]", len(whole.text))) ||
		!strings.HasPrefix(whole.text, out[:note]) {
		t.Fatalf("tool_result's raw_output ends %q, want the note with the whole answer's %d bytes", out[max(0, len(out)-80):], len(whole.text))
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if len(sb.limits) != 1 || sb.limits[0] != MaxLiveToolOutputBytes {
		t.Fatalf("recalls sent answer_limit %v, want one of %d", sb.limits, MaxLiveToolOutputBytes)
	}
	if reply := sb.replies[0]; !old && reply > MaxLiveToolOutputBytes+64 {
		t.Fatalf("the sandbox's reply was %d bytes, want at most the %d shown", reply, MaxLiveToolOutputBytes)
	}
}

// The recall tool's answer was built whole, 18 MiB of JSON for three
// memories of 1 MiB of control characters (96 MiB for the sandbox's
// 16 MiB message), to be cut at once to the 1 MiB its update carries.
// It is built only to MaxLiveToolOutputBytes: the bytes allocated while
// building are counted (runtime.MemStats, not timed).
func TestRecallAnswerIsBuiltOnlyAsFarAsItIsShown(t *testing.T) {
	ctrl := strings.Repeat("\x01", 1<<20)
	entries := []*pluginv1.MemoryEntry{{Key: "a", Content: ctrl}, {Key: "b", Content: ctrl}, {Key: "c", Content: ctrl}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	got, err := recallAnswer(context.Background(), entries, MaxLiveToolOutputBytes)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	const wholeSize = 3*(len(`{"key":"a","content":""}`)+6<<20) + len("[,,]")
	if built := after.TotalAlloc - before.TotalAlloc; built > 2*MaxLiveToolOutputBytes || len(got.text) > MaxLiveToolOutputBytes {
		t.Fatalf("built %d bytes (%d allocated) of a %d-byte answer, want at most %d", len(got.text), built, got.total, MaxLiveToolOutputBytes)
	}
	if got.size() != wholeSize {
		t.Fatalf("whole answer's size %d, want %d", got.size(), wholeSize)
	}
}

// Cut at any room, the answer is the start of the whole one, and what a
// reader cut of it at a bound of at least that room (the live update's,
// the transcript's) is what it cut of the whole answer, note included.
func TestRecallAnswerCutIsTheWholeOnesStart(t *testing.T) {
	entries := []*pluginv1.MemoryEntry{
		{Key: "k\"1", Content: strings.Repeat("ab\x01é\u2028<\xff", 300), Category: "notes"},
		{Key: "k2", Content: strings.Repeat("plain text ", 200)},
		{Key: "k3", Content: strings.Repeat("\n\"", 500), Category: "c"},
	}
	ctx := context.Background()
	whole, err := recallAnswer(ctx, entries, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	const note = " [cut: %d of %d]"
	for room := 129; room <= len(whole.text)+8; room += 13 {
		cut, err := recallAnswer(ctx, entries, room)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(whole.text, cut.text) || cut.size() != len(whole.text) ||
			(len(cut.text) < len(whole.text) && len(cut.text) < room-5) || len(cut.text) > room {
			t.Fatalf("room %d: built %d bytes of %d (size %d), not the whole answer's start", room, len(cut.text), len(whole.text), cut.size())
		}
		if got, want := cutJSONOf(cut.text, cut.size(), room, note), cutJSON(whole.text, room, note); got != want {
			t.Fatalf("room %d: a reader's cut\n%q\nwant\n%q", room, got, want)
		}
		if got, want := tooloutput.KeptOf(cut.text, cut.size()), tooloutput.Kept(whole.text); len(cut.text) >= tooloutput.MaxKeptBytes && got != want {
			t.Fatalf("room %d: kept\n%q\nwant\n%q", room, got, want)
		}
	}
}

// A caller that went away stops the building.
func TestRecallAnswerStopsWithItsCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := recallAnswer(ctx, []*pluginv1.MemoryEntry{{Key: "a", Content: "x"}}, MaxLiveToolOutputBytes); !errors.Is(err, context.Canceled) {
		t.Fatalf("recall answer for a caller gone: %v, want %v", err, context.Canceled)
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
		got, err := recallAnswer(context.Background(), entries, math.MaxInt)
		if err != nil || got.text != string(b) || got.size() != len(b) {
			t.Fatalf("recall answer\n%q (%v)\nwant\n%q", got.text, err, b)
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
		_, _ = recallAnswer(b.Context(), entries, MaxLiveToolOutputBytes)
	}
}

// A sandbox's own answer is not trusted to keep to the room it was sent:
// a longer one is cut at a character to what is shown, and a size below
// the text's is the text's.
func TestRecallReplyKeepsToTheRoomShown(t *testing.T) {
	long := strings.Repeat("é", MaxLiveToolOutputBytes)
	got := recallReply(long, 5)
	if len(got.text) > MaxLiveToolOutputBytes || !strings.HasPrefix(long, got.text) || got.size() != len(got.text) {
		t.Fatalf("an answer of %d bytes said to be 5: kept %d bytes, size %d", len(long), len(got.text), got.size())
	}
	if got := recallReply(`[{"key":"k","content":"x`, 1<<30); got.text != `[{"key":"k","content":"x` || got.size() != 1<<30 {
		t.Fatalf("a cut answer: %q of %d", got.text, got.size())
	}
}
