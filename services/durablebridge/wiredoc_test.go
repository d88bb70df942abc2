package durablebridge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every error code the bridge sends is in the wire document's table of
// codes: five were sent that it never named (queue-full,
// conversation-ended, unavailable, no-such-tab, no-such-workspace), and a
// Collie written from the document would not know them.
func TestEveryErrorCodeIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/durable-wire.md")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "wire.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "code") || len(vs.Values) != 1 {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			v, _ := strconv.Unquote(lit.Value)
			codes = append(codes, v)
		}
		return true
	})
	if len(codes) < 20 {
		t.Fatalf("found %d codes in wire.go: %v", len(codes), codes)
	}
	for _, c := range codes {
		if !strings.Contains(string(doc), "`"+c+"`") && !strings.Contains(string(doc), `"code":"`+c+`"`) {
			t.Errorf("code %q is sent but docs/durable-wire.md does not name it", c)
		}
	}
}

// The wire document's JSON examples use the ids and actions the bridge
// sends: its snapshot showed a "cancel" action the bridge refuses
// ("`action` is not one of this pane's actions"), a workspace "data"
// and a tab "agent-default" where the bridge says ws-main and
// tab-default, so a Collie written from it pressed a button that does
// not exist.
func TestWireDocExamplesUseTheBridgesIDs(t *testing.T) {
	doc, err := os.ReadFile("../../docs/durable-wire.md")
	if err != nil {
		t.Fatal(err)
	}
	offered := map[string]string{}
	for _, running := range []bool{false, true} {
		p := &pane{}
		if running {
			p.turn = &turnInfo{}
		}
		for _, a := range p.actions() {
			offered[a.ID] = a.Label
		}
	}
	actions := regexp.MustCompile(`"actions":\[([^\]]*)\]`).FindAllStringSubmatch(string(doc), -1)
	if len(actions) == 0 {
		t.Fatal("no \"actions\" in docs/durable-wire.md's examples")
	}
	for _, m := range actions {
		for _, a := range regexp.MustCompile(`\{"id":"([^"]*)","label":"([^"]*)"\}`).FindAllStringSubmatch(m[1], -1) {
			if label, ok := offered[a[1]]; !ok || label != a[2] {
				t.Errorf("example action {%q, %q}: the bridge offers %v", a[1], a[2], offered)
			}
		}
	}
	for _, want := range []string{`"workspaces":[{"id":"` + workspaceID + `"`, `"tabs":[{"id":"` + tabID("default") + `"`} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/durable-wire.md's snapshot example lacks %s", want)
		}
	}
}
