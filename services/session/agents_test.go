package session

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/configclient"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// configDoc stands for the followed live document (Current) and the
// config service's Reveal; the other methods are not called.
type configDoc struct {
	configv1.ConfigServiceClient
	doc     map[string]any
	secrets map[string]string
}

// Current decodes the document from JSON, as configclient does.
func (c *configDoc) Current() configclient.Snapshot {
	raw, _ := json.Marshal(c.doc)
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	return configclient.Snapshot{Revision: 1, Document: doc}
}

func (c *configDoc) Reveal(_ context.Context, req *configv1.RevealRequest, _ ...grpc.CallOption) (*configv1.RevealResponse, error) {
	v, ok := c.secrets[req.GetProp()]
	return &configv1.RevealResponse{Found: ok, Value: structpb.NewStringValue(v)}, nil
}

// Agents are read from the live config document: agents.<alias>.* from
// the followed document, the api_key from Reveal; default exists without
// an entry.
func TestConfigAgents(t *testing.T) {
	src := &configDoc{
		doc: map[string]any{"agents": map[string]any{
			"default": map[string]any{"approval_required": []any{"echo"}, "approval_timeout_secs": 2},
			"gpt": map[string]any{
				"provider": "openai", "model": "gpt-x", "base_url": "http://localhost:1/v1", "api_key": "***MASKED***",
				"system_prompt": "be brief", "tools": []any{"echo"}, "timeout_secs": 2,
			},
		}},
		secrets: map[string]string{"agents.gpt.api_key": "sk-real"},
	}
	agents := &ConfigAgents{Live: src, Client: src, Log: zap.NewNop()}
	ctx := context.Background()

	def, err := agents.Agent(ctx, "default")
	if err != nil || def.Provider != ProviderScripted || !def.needsApproval("echo") || def.ApprovalTimeout != 2*time.Second {
		t.Fatalf("default: %+v %v", def, err)
	}
	gpt, err := agents.Agent(ctx, "gpt")
	if err != nil || gpt.Provider != ProviderOpenAI || gpt.Model != "gpt-x" || gpt.APIKey != "sk-real" || gpt.SystemPrompt != "be brief" ||
		!gpt.offers("echo") || gpt.offers("other") || gpt.Timeout != 2*time.Second || gpt.ApprovalTimeout != 120*time.Second {
		t.Fatalf("gpt: %+v %v", gpt, err)
	}
	if _, err := agents.Agent(ctx, "ghost"); !errors.Is(err, ErrUnknownAgent) {
		t.Fatalf("unknown alias: %v", err)
	}

	src.doc = map[string]any{}
	if def, err := agents.Agent(ctx, "default"); err != nil || def.Provider != ProviderScripted || def.needsApproval("echo") {
		t.Fatalf("default without an entry: %+v %v", def, err)
	}
}
