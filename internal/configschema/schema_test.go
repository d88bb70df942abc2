package configschema

import (
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The edge limits the gateway reads, with the names and defaults it
// expects.
func TestGatewayLimitsDefaults(t *testing.T) {
	doc := Effective(map[string]any{})
	for path, want := range map[string]any{
		"rpc.max_frame_bytes":                  int64(8388608),
		"rpc.initialize_timeout_ms":            int64(30000),
		"rpc.frame_timeout_ms":                 int64(30000),
		"rpc.write_stall_timeout_ms":           int64(30000),
		"rpc.max_local_connections":            int64(512),
		"rpc.advertised_server_version":        "",
		"agents.default.provider":              "scripted",
		"agents.default.approval_timeout_secs": int64(120),
		"agents.default.step_timeout_secs":     int64(1800),
		"plugins.limits.call_fuel":             int64(1_000_000_000),
		"plugins.security.signature_mode":      "permissive",
	} {
		if got, ok := Get(doc, path); !ok || got != want {
			t.Errorf("%s = %#v, want %#v", path, got, want)
		}
	}
	p, _ := Lookup("rpc.max_local_connections")
	if !p.Restart {
		t.Error("rpc.max_local_connections must say it requires a restart")
	}
	// Map entries get their fields' defaults; maps without entries stay empty.
	doc = Effective(map[string]any{"users": map[string]any{"bob": map[string]any{"uid": int64(7)}}})
	if got, _ := Get(doc, "users.bob.permission_profiles"); !reflect.DeepEqual(got, []any{}) {
		t.Errorf("users.bob.permission_profiles = %#v", got)
	}
	if got, _ := Get(doc, "permission_profiles"); !reflect.DeepEqual(got, map[string]any{}) {
		t.Errorf("permission_profiles = %#v", got)
	}
}

func TestLookup(t *testing.T) {
	for path, want := range map[string]string{
		"users.alice.uid":                  "users.*.uid",
		"plugins.entries.my-plugin.config": "plugins.entries.*.config",
		"agents.default":                   "",
		"agents.default.colour":            "",
		"users.a.b.uid":                    "",
		"users..uid":                       "",
		"users.has space.uid":              "",
		"users.*.uid":                      "", // a pattern, not an entry
		"plugins.entries.*.config":         "",
	} {
		p, err := LookupLeaf(path)
		switch {
		case want == "" && err == nil:
			t.Errorf("%s matched %s", path, p.Path)
		case want != "" && (err != nil || p.Path != want):
			t.Errorf("%s: %v %v, want %s", path, p, err, want)
		}
	}
	if !Readable("agents.default") || !Readable("plugins.limits") || Readable("plugins.nope") {
		t.Error("Readable")
	}
	if EntryMap("users.alice") == nil || EntryMap("users.alice.uid") != nil || EntryMap("rpc.x") != nil || EntryMap("users.*") == nil {
		t.Error("EntryMap")
	}
}

func TestCheckAndParseText(t *testing.T) {
	cases := []struct {
		path, raw string
		want      any
		bad       bool
	}{
		{"rpc.max_local_connections", "64", int64(64), false},
		{"rpc.max_local_connections", "0", nil, true},
		{"rpc.max_local_connections", "1.5", nil, true},
		{"rpc.max_local_connections", "many", nil, true},
		{"agents.default.model", "123", "123", false},
		{"agents.default.model", `"quoted"`, "quoted", false},
		{"agents.default.tools", "a, b,,c", []any{"a", "b", "c"}, false},
		{"agents.default.tools", `["x"]`, []any{"x"}, false},
		{"agents.default.tools", `[1]`, nil, true},
		{"durable.refuse_descendants", "true", true, false},
		{"durable.refuse_descendants", "yes", nil, true},
		{"plugins.security.signature_mode", "strict", "strict", false},
		{"plugins.security.signature_mode", "loose", nil, true},
		{"plugins.entries.k.config", `{"a":"b"}`, map[string]any{"a": "b"}, false},
		{"plugins.entries.k.config", `{"a":1}`, nil, true},
		{"agents.default.base_url", "ftp://x", nil, true},
		{"permission_profiles.p.permissions", "Config:Update,files:create", []any{"Config:Update", "files:create"}, false},
		{"permission_profiles.p.permissions", "root", nil, true},
		{"permission_profiles.p.config_paths", "agents.*.model,*", []any{"agents.*.model", "*"}, false},
		{"permission_profiles.p.config_paths", "agents..model", nil, true},
		// Latin-1 text: stored as U+FFFD, it was not the value typed.
		{"agents.default.system_prompt", "caf\xe9", nil, true},
		{"agents.default.tools", "caf\xe9", nil, true},
		{"agents.default.tools", "[\"caf\xe9\"]", nil, true},
	}
	for _, c := range cases {
		got, err := ParseText(c.path, c.raw)
		if c.bad != (err != nil) || (!c.bad && !reflect.DeepEqual(got, c.want)) {
			t.Errorf("%s=%s: %#v %v", c.path, c.raw, got, err)
		}
		if c.bad && !errors.Is(err, ErrType) {
			t.Errorf("%s=%s: %v is not ErrType", c.path, c.raw, err)
		}
	}
}

func TestValidateAndBlame(t *testing.T) {
	doc := Effective(map[string]any{
		"permission_profiles": map[string]any{"ops": map[string]any{}},
		"users": map[string]any{
			"a": map[string]any{"uid": int64(1), "permission_profiles": []any{"ops"}},
			"b": map[string]any{"uid": int64(2), "permission_profiles": []any{"ops", "ghost"}},
		},
	})
	err := Validate(doc)
	if !errors.Is(err, ErrReference) {
		t.Fatalf("dangling profile: %v", err)
	}
	if i := Blame(err, []string{"users.a.uid", "users.b.permission_profiles", "agents.x.model"}); i != 1 {
		t.Fatalf("blamed %d", i)
	}
	if i := Blame(err, []string{"permission_profiles.ghost2.permissions", "permission_profiles.ops"}); i != 1 {
		t.Fatalf("a change to the referenced map is blamed: %d", i)
	}
	_ = Set(doc, "users.b.permission_profiles", []any{"ops"})
	_ = Set(doc, "users.b.uid", int64(1))
	if err := Validate(doc); err == nil {
		t.Fatal("two users with one uid")
	}
	_ = Set(doc, "users.b.uid", int64(2))
	_ = Set(doc, "permission_profiles.ops.agents", []any{"*", "default"})
	if err := Validate(doc); err != nil {
		t.Fatal(err)
	}
	_ = Set(doc, "permission_profiles.ops.agents", []any{"nobody"})
	if err := Validate(doc); !errors.Is(err, ErrReference) {
		t.Fatalf("unknown agent: %v", err)
	}
}

func TestMaskAndPatterns(t *testing.T) {
	doc := Effective(map[string]any{
		"agents":  map[string]any{"default": map[string]any{"api_key": "sk"}, "x": map[string]any{}},
		"plugins": map[string]any{"entries": map[string]any{"p": map[string]any{"config": map[string]any{"k": "v"}}}},
	})
	m := Mask(doc)
	if v, _ := Get(m, "agents.default.api_key"); v != Masked {
		t.Error(v)
	}
	if v, _ := Get(m, "agents.x.api_key"); v != "" {
		t.Errorf("an unset secret reads empty: %v", v)
	}
	if v, _ := Get(m, "plugins.entries.p.config"); !reflect.DeepEqual(v, map[string]any{"k": Masked}) {
		t.Error(v)
	}
	if v, _ := Get(doc, "agents.default.api_key"); v != "sk" {
		t.Error("Mask changed its input")
	}
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"*", "rpc.max_frame_bytes", true},
		{"agents", "agents.x.model", true},
		{"agents.*.model", "agents.x.model", true},
		{"agents.*.model", "agents.x.api_key", false},
		{"agents.x", "agents.xy.model", false},
		{"agents.*.model", "agents", false},
	} {
		if MatchPattern(c.pattern, c.path) != c.want {
			t.Errorf("MatchPattern(%q, %q) != %v", c.pattern, c.path, c.want)
		}
	}
}

// The unfinished-frame budget must hold a largest frame twice: its blocks
// and the slice they are copied into.
func TestFrameBudgetHoldsALargestFrame(t *testing.T) {
	doc := Effective(map[string]any{"rpc": map[string]any{"max_frame_bytes": int64(8 << 20), "max_buffered_frame_bytes": int64(16<<20 - 1)}})
	if err := Validate(doc); err == nil || !strings.Contains(err.Error(), "at least 2 ×") {
		t.Fatalf("a budget smaller than 2 frames: %v", err)
	}
	doc = Effective(map[string]any{"rpc": map[string]any{"max_frame_bytes": int64(8 << 20), "max_buffered_frame_bytes": int64(16 << 20)}})
	if err := Validate(doc); err != nil {
		t.Fatalf("a budget of 2 frames: %v", err)
	}
}

// The rows whose length bound left the pattern for MaxLen (a counted
// repetition compiled to as many copies, 4 ms at every process's start)
// accept and refuse what the patterns that counted did, at the bounds and
// around them, in characters: multi-byte ones, invalid bytes and control
// characters included.
func TestLengthBoundsAsCountedPatterns(t *testing.T) {
	counted := map[string]*regexp.Regexp{
		"rpc.advertised_server_version":  regexp.MustCompile(`^[^\x00-\x1f]{0,64}$`),
		"durable.starters.*.title":       regexp.MustCompile(`^[^\x00-\x1f]{0,64}$`),
		"durable.starters.*.description": regexp.MustCompile(`^[^\x00-\x1f]{0,256}$`),
		"agents.*.tools":                 regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$`),
		"agents.*.approval_required":     regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$`),
		"channels.plugin.*.plugin":       regexp.MustCompile(`^(|[a-z0-9][a-z0-9_-]{0,63})$`),
	}
	oldName := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_:@-]{0,63}$`)
	var inputs []string
	for _, n := range []int{0, 1, 2, 31, 32, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300} {
		for _, c := range []string{"a", "Z", "_", ".", ":", "-", "@", " ", "é", "日", "\x01", "\x1f", "\x7f", "\xff"} {
			inputs = append(inputs, strings.Repeat(c, n), "a"+strings.Repeat(c, n), strings.Repeat(c, n)+"\n")
		}
	}
	checked := 0
	for path, old := range counted {
		p, err := Lookup(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range inputs {
			var v any = in
			if p.Type == Array {
				v = []any{in}
			}
			_, err := p.Check(v)
			if got, want := err == nil, old.MatchString(in); got != want {
				t.Errorf("%s: %q (%d bytes): accepted %v, the counted pattern %v (%v)", path, in, len(in), got, want, err)
			}
			checked++
		}
	}
	for _, in := range inputs {
		if got, want := ValidName(in), oldName.MatchString(in); got != want {
			t.Errorf("ValidName(%q): %v, the counted pattern %v", in, got, want)
		}
	}
	if checked < 2000 {
		t.Fatalf("only %d checks", checked)
	}
}

// A group (rpc, plugins.limits) or a map entry (agents.default) is
// something config/get reads; written or deleted, it was refused as an
// "unknown config property", which it is not. It is named for what it
// is.
func TestLookupLeafNamesAGroup(t *testing.T) {
	for _, path := range []string{"rpc", "plugins.limits", "agents.default"} {
		_, err := LookupLeaf(path)
		if !errors.Is(err, ErrNotLeaf) || !strings.Contains(err.Error(), "a group of properties") {
			t.Errorf("%s: %v", path, err)
		}
	}
	if _, err := LookupLeaf("rpc.nope"); !errors.Is(err, ErrUnknown) {
		t.Errorf("rpc.nope: %v", err)
	}
}
