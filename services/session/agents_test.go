package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// configDoc answers Live and Reveal like the config service does; the
// other methods are not called.
type configDoc struct {
	configv1.ConfigServiceClient
	doc     map[string]any
	liveErr error
	secrets map[string]string
}

func (c *configDoc) Live(context.Context, *configv1.LiveRequest, ...grpc.CallOption) (*configv1.LiveResponse, error) {
	if c.liveErr != nil {
		return nil, c.liveErr
	}
	doc, err := structpb.NewStruct(c.doc)
	return &configv1.LiveResponse{Revision: 1, Document: doc}, err
}

func (c *configDoc) Reveal(_ context.Context, req *configv1.RevealRequest, _ ...grpc.CallOption) (*configv1.RevealResponse, error) {
	v, ok := c.secrets[req.GetProp()]
	return &configv1.RevealResponse{Found: ok, Value: structpb.NewStringValue(v)}, nil
}

// Agents are read from the config document: agents.<alias>.* from Live,
// the api_key from Reveal; default exists without an entry.
func TestConfigAgents(t *testing.T) {
	src := &configDoc{
		doc: map[string]any{"agents": map[string]any{
			"default": map[string]any{"approval_required": []any{"echo"}, "approval_timeout_secs": 2},
			"gpt": map[string]any{
				"provider": "openai", "model": "gpt-x", "base_url": "http://localhost:1/v1", "api_key": "***MASKED***",
				"system_prompt": "be brief", "tools": []any{"echo"}, "timeout_secs": 1.5,
			},
		}},
		secrets: map[string]string{"agents.gpt.api_key": "sk-real"},
	}
	agents := &ConfigAgents{Client: src, Log: zap.NewNop()}
	ctx := context.Background()

	def, err := agents.Agent(ctx, "default")
	if err != nil || def.Provider != ProviderScripted || !def.needsApproval("echo") || def.ApprovalTimeout != 2*time.Second {
		t.Fatalf("default: %+v %v", def, err)
	}
	gpt, err := agents.Agent(ctx, "gpt")
	if err != nil || gpt.Provider != ProviderOpenAI || gpt.Model != "gpt-x" || gpt.APIKey != "sk-real" || gpt.SystemPrompt != "be brief" ||
		!gpt.offers("echo") || gpt.offers("other") || gpt.Timeout != 1500*time.Millisecond || gpt.ApprovalTimeout != DefaultApprovalTimeout {
		t.Fatalf("gpt: %+v %v", gpt, err)
	}
	if _, err := agents.Agent(ctx, "ghost"); !errors.Is(err, ErrUnknownAgent) {
		t.Fatalf("unknown alias: %v", err)
	}

	src.doc = map[string]any{}
	if def, err := agents.Agent(ctx, "default"); err != nil || def.Provider != ProviderScripted || def.needsApproval("echo") {
		t.Fatalf("default without an entry: %+v %v", def, err)
	}
	src.liveErr = status.Error(codes.Unavailable, "connection refused")
	if def, err := agents.Agent(ctx, "default"); err != nil || def.Provider != ProviderScripted {
		t.Fatalf("default while config is down: %+v %v", def, err)
	}
	if _, err := agents.Agent(ctx, "gpt"); err == nil || errors.Is(err, ErrUnknownAgent) {
		t.Fatalf("other agents while config is down: %v", err)
	}
}
