package durablebridge

import (
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
)

// A starter at a principal's bound of open sessions was answered "the
// session service did not answer" (and logged as a failed call): the
// service did answer. Its refusal is said as it is, as a 503, which is
// not remembered, so the same request id may be tried once there is room.
func TestSessionLimitSaidAsItIs(t *testing.T) {
	w := newWireBridge(t, false)
	msg := "1000 sessions are open for this principal, the limit; close or delete one first"
	code, body := w.b.sessionRefusal("new session", rpcerr.Error(codes.ResourceExhausted, rpcerr.ReasonSessionLimit, rpcerr.NoIndex, msg), codeNoSuchStarter)
	if e, ok := body.(wireError); code != http.StatusServiceUnavailable || !ok || e.Code != codeUnavailable || e.Message != msg {
		t.Fatalf("refusal at the bound: %d %+v", code, body)
	}
}
