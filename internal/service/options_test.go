package service

import (
	"testing"

	"github.com/clawmesh/clawmesh/internal/stack"
)

// Only a process that runs several replicas bounds its connections' age:
// the others have one address and nothing to rediscover.
func TestReplicaConnectionsAge(t *testing.T) {
	for _, p := range stack.Processes {
		if got := len(serverOptions(p.Name)); (got > 0) != p.Scalable {
			t.Errorf("%s (scalable %v): %d server options", p.Name, p.Scalable, got)
		}
	}
}
