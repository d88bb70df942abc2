//go:build wasip1

package tool

import (
	"encoding/json"

	"github.com/clawmesh/clawmesh/plugins/abi"
)

// init builds encoding/json's encoders for the result envelope in the
// module's initialisation (pre-instantiation) rather than in the first, and
// for a fresh instance only, tool_execute. See the guest package's warm-up.
func init() {
	msg := "warm-up"
	_, _ = json.Marshal(abi.ToolEnvelope{Ok: &abi.ToolResult{Success: true, Output: msg, Error: &msg}})
	_, _ = json.Marshal(abi.ToolEnvelope{Err: &msg})
}
