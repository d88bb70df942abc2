package main

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/jsonexact"
)

// clawmesh up --set and clawmesh config set read values with the schema
// (configschema.ParseText), exactly: 2^53+1 is refused naming the
// property before anything is sent, 2^53 is the limit.
func TestSetReadsIntegersExactly(t *testing.T) {
	_, err := configschema.ParseText("plugins.limits.call_fuel", "9007199254740993")
	if !errors.Is(err, jsonexact.ErrInexact) || !strings.HasPrefix(err.Error(), "`plugins.limits.call_fuel`:") {
		t.Fatalf("2^53+1: %v", err)
	}
	v, err := configschema.ParseText("plugins.limits.call_fuel", "9007199254740992")
	if err != nil || v != int64(1<<53) {
		t.Fatalf("2^53: %v %v", v, err)
	}
	err = configCmd([]string{"set", "plugins.limits.call_fuel=9007199254740993", "--socket", "/nonexistent/socket"}, io.Discard)
	if !errors.Is(err, jsonexact.ErrInexact) || !strings.Contains(err.Error(), "plugins.limits.call_fuel") {
		t.Fatalf("clawmesh config set 2^53+1: %v", err)
	}
}
