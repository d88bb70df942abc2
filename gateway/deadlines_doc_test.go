package gateway

import (
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/configschema"
)

// Where the deadlines are told (rpc.call_timeout_ms's schema text, which
// `clawmesh config schema` prints, the README and design.md), every
// method the table gives three times rpc.call_timeout_ms is named: the
// config writes by that phrase, the others by name. file/attach and
// file/upload/commit were left out, read as short calls.
func TestSlowMethodsNamedWhereDeadlinesAreTold(t *testing.T) {
	p, err := configschema.Lookup("rpc.call_timeout_ms")
	if err != nil {
		t.Fatal(err)
	}
	texts := map[string]string{"rpc.call_timeout_ms's Doc": p.Doc}
	for _, doc := range []string{"../README.md", "../docs/design.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Join(strings.Fields(string(b)), " ")
		i := strings.Index(s, "three times it")
		if i < 0 {
			t.Fatalf("%s does not say which calls get three times rpc.call_timeout_ms", doc)
		}
		end := strings.Index(s[i:], ";")
		texts[doc] = s[i : i+end]
	}
	var slow []string
	for name, m := range methods {
		if m.kind == kindSlow {
			slow = append(slow, name)
		}
	}
	sort.Strings(slow)
	for where, text := range texts {
		for _, name := range slow {
			named := strings.Contains(text, name)
			if strings.HasPrefix(name, "config/") {
				named = named || strings.Contains(text, "config writes")
			}
			if !named {
				t.Errorf("%s does not name %s among the calls with three times the deadline: %q", where, name, text)
			}
		}
	}
}
