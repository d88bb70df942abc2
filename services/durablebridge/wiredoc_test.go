package durablebridge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
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
