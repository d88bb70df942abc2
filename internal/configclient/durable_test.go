package configclient_test

import (
	"testing"

	"github.com/clawmesh/clawmesh/internal/configclient"
	"github.com/clawmesh/clawmesh/internal/configschema"
)

// durable.starters reads in id order, each field falling back to the
// schema's default; the schema checks a starter's agent exists.
func TestDurableStarters(t *testing.T) {
	s := configclient.Snapshot{Document: map[string]any{
		"durable": map[string]any{"starters": map[string]any{
			"review": map[string]any{"title": "Review a change", "prompt": "/say review", "agent": "gpt"},
			"ask":    map[string]any{},
		}},
	}}
	d := s.Durable()
	if len(d.Starters) != 2 || d.Starters[0].ID != "ask" || d.Starters[1].ID != "review" {
		t.Fatalf("starters %+v", d.Starters)
	}
	if a := d.Starters[0]; a.Agent != "default" || a.Title != "" || a.Prompt != "" {
		t.Fatalf("defaults of a bare starter %+v", a)
	}
	if r := d.Starters[1]; r.Title != "Review a change" || r.Prompt != "/say review" || r.Agent != "gpt" {
		t.Fatalf("starter %+v", r)
	}
	if len(configclient.Snapshot{}.Durable().Starters) != 0 {
		t.Fatal("starters out of nothing")
	}
	doc := map[string]any{
		"agents":  map[string]any{"default": map[string]any{}},
		"durable": map[string]any{"starters": map[string]any{"x": map[string]any{"agent": "nobody"}}},
	}
	if err := configschema.Validate(doc); err == nil {
		t.Fatal("a starter naming an unknown agent was accepted")
	}
}
