package abi_test

import (
	"slices"
	"testing"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// Every world's import set names only real imports, and every world that
// has exports has an import set (logging at least).
func TestWorldTablesAreConsistent(t *testing.T) {
	for w, exports := range abi.WorldExports {
		if len(exports) == 0 {
			t.Errorf("world %s has no exports", w)
		}
		imports, ok := abi.WorldImports[w]
		if !ok || !slices.Contains(imports, abi.ImportLogRecord) {
			t.Errorf("world %s: imports %v lack logging", w, imports)
		}
		for _, name := range imports {
			if !slices.Contains(abi.Imports, name) {
				t.Errorf("world %s: unknown import %s", w, name)
			}
		}
	}
	if abi.WorldHasImport(abi.WorldTool, abi.ImportConfigGet) {
		t.Error("seed 003 gives config only to the channel world")
	}
	if !abi.WorldHasImport(abi.WorldChannel, abi.ImportConfigGet) || !abi.WorldHasImport(abi.WorldTool, abi.ImportSecretsGet) {
		t.Error("channel must have config, tool must have secrets")
	}
}
