package config

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// whoIs is the audit record of a principal's commit.
func whoIs(pr *commonv1.Principal) audit {
	pid := pr.GetPeerPid()
	a := audit{by: pr.GetPrincipalId(), peerPID: &pid}
	// -1 is the gateway's "no credentials" (peerIs), no uid to record.
	if peer := pr.GetPeerUid(); peer != -1 {
		uid := int64(uint32(peer))
		a.peerUID = &uid
	}
	return a
}

// batchError prefixes an entry's refusal with its place in the batch.
func batchError(err error) error {
	var ee *entryError
	if errors.As(err, &ee) && ee.index >= 0 {
		ee.err = fmt.Errorf("sets[%d]: %w", ee.index, ee.err)
	}
	return toStatus(err)
}

func invalidArg(format string, args ...any) error {
	return rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, rpcerr.NoIndex, fmt.Sprintf(format, args...))
}

func requirePrincipal(pr *commonv1.Principal) error {
	if pr.GetPrincipalId() == "" {
		return rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex, "no principal: the caller must initialize first")
	}
	return nil
}

// SetMany is config/set-many (seed 000, docs/spec.md §7).
func (s *Server) SetMany(ctx context.Context, req *configv1.SetManyRequest) (*configv1.SetManyResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	n := len(req.GetSets())
	if n < MinBatch || n > MaxBatch {
		return nil, invalidArg("`sets` must hold %d to %d entries; it has %d", MinBatch, MaxBatch, n)
	}
	writes := make([]write, n)
	for i, e := range req.GetSets() {
		if e.GetProp() == "" {
			return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, i, fmt.Sprintf("sets[%d]: `prop` is required", i))
		}
		if e.GetValue() == nil {
			return nil, rpcerr.Error(codes.InvalidArgument, rpcerr.ReasonInvalid, i, fmt.Sprintf("sets[%d]: `value` is required", i))
		}
		writes[i] = write{prop: e.GetProp(), value: e.GetValue().AsInterface()}
	}
	snap, err := s.commit(ctx, commitRequest{principal: req.GetPrincipal(), who: whoIs(req.GetPrincipal()), writes: writes})
	if err != nil {
		return nil, batchError(err)
	}
	props := make([]string, n)
	for i, w := range writes {
		props[i] = w.prop
	}
	return &configv1.SetManyResponse{Props: unique(props), Revision: snap.revision}, nil
}

// Set is config/set: a batch of one.
func (s *Server) Set(ctx context.Context, req *configv1.SetRequest) (*configv1.SetResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	if req.GetProp() == "" {
		return nil, invalidArg("`prop` is required")
	}
	if req.GetValue() == nil {
		return nil, invalidArg("`value` is required")
	}
	snap, err := s.commit(ctx, commitRequest{principal: req.GetPrincipal(), who: whoIs(req.GetPrincipal()),
		writes: []write{{prop: req.GetProp(), value: req.GetValue().AsInterface()}}})
	if err != nil {
		return nil, single(err)
	}
	return &configv1.SetResponse{Prop: req.GetProp(), Revision: snap.revision}, nil
}

// single maps a refusal of a one-entry write: no batch index.
func single(err error) error {
	var ee *entryError
	if errors.As(err, &ee) {
		ee.index = rpcerr.NoIndex
	}
	return toStatus(err)
}

// Delete is config/delete: a property goes back to its default, a map
// entry (users.<name>, agents.<alias>, ...) is removed. The candidate is
// validated whole, so a profile still named by a user cannot go.
func (s *Server) Delete(ctx context.Context, req *configv1.DeleteRequest) (*configv1.DeleteResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	if req.GetProp() == "" {
		return nil, invalidArg("`prop` is required")
	}
	snap, err := s.commit(ctx, commitRequest{principal: req.GetPrincipal(), who: whoIs(req.GetPrincipal()),
		writes: []write{{prop: req.GetProp(), delete: true}}})
	if err != nil {
		return nil, single(err)
	}
	return &configv1.DeleteResponse{Prop: req.GetProp(), Revision: snap.revision}, nil
}

// Get is config/get: one property, group or map entry, or the whole
// document when prop is empty; secrets masked. A principal without
// Config:Read on a path is refused it; the whole document is limited to
// what the principal may read.
func (s *Server) Get(ctx context.Context, req *configv1.GetRequest) (*configv1.GetResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	snap := s.current()
	prop := req.GetProp()
	if prop == "" {
		if err := snap.standing(req.GetPrincipal()); err != nil {
			return nil, err
		}
		doc := snap.readable(req.GetPrincipal())
		v, err := structpb.NewValue(doc)
		if err != nil {
			return nil, fmt.Errorf("encode config: %w", err)
		}
		return &configv1.GetResponse{Value: v, Revision: snap.revision}, nil
	}
	if !configschema.Readable(prop) {
		return nil, invalidArg("unknown config property `%s`", prop)
	}
	if d := snap.authorize(req.GetPrincipal(), PermConfigRead, prop); !d.allowed {
		return nil, rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, d.reason)
	}
	raw, ok := configschema.Get(snap.masked, prop)
	if !ok {
		return nil, rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex, fmt.Sprintf("`%s` is not set", prop))
	}
	v, err := structpb.NewValue(raw)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", prop, err)
	}
	return &configv1.GetResponse{Prop: prop, Value: v, Revision: snap.revision}, nil
}

// standing refuses, saying why, a principal whose binding no longer
// stands (its token revoked, its user removed or given another uid).
// The whole document and the list are cut down to what a principal may
// read; without it such a principal got them empty, an answer, where
// docs/spec.md §4 promises every config call a refusal naming why.
func (sn *snapshot) standing(pr *commonv1.Principal) error {
	if d := sn.authorize(pr, configschema.PermStanding, ""); !d.allowed {
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, d.reason)
	}
	return nil
}

// readable is the masked document cut down to what pr may read.
func (sn *snapshot) readable(pr *commonv1.Principal) map[string]any {
	if sn.authorize(pr, PermConfigRead, "").allowed {
		return sn.masked
	}
	out := map[string]any{}
	for _, e := range configschema.Flatten(sn.masked) {
		if sn.authorize(pr, PermConfigRead, e.Prop).allowed {
			_ = configschema.Set(out, e.Prop, e.Value)
		}
	}
	return out
}

// List is config/list: every property (defaults included) whose path
// starts with prefix and that the principal may read, secrets masked.
func (s *Server) List(ctx context.Context, req *configv1.ListRequest) (*configv1.ListResponse, error) {
	if err := requirePrincipal(req.GetPrincipal()); err != nil {
		return nil, err
	}
	snap := s.current()
	if err := snap.standing(req.GetPrincipal()); err != nil {
		return nil, err
	}
	entries := []*configv1.Entry{}
	for _, e := range configschema.Flatten(snap.readable(req.GetPrincipal())) {
		if !strings.HasPrefix(e.Prop, req.GetPrefix()) {
			continue
		}
		v, err := structpb.NewValue(e.Value)
		if err != nil {
			return nil, fmt.Errorf("encode %s: %w", e.Prop, err)
		}
		entries = append(entries, &configv1.Entry{Prop: e.Prop, Value: v})
	}
	return &configv1.ListResponse{Entries: entries, Revision: snap.revision}, nil
}

// Live returns the whole effective document, secrets masked.
func (s *Server) Live(context.Context, *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	snap := s.current()
	doc, err := structpb.NewStruct(snap.masked)
	if err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	return &configv1.LiveResponse{Revision: snap.revision, Document: doc, History: snap.history, Digest: snap.digest}, nil
}

// Reveal returns one value unmasked. It is for services (the session
// service reads agents.<alias>.api_key, the plugin sandbox
// plugins.entries.<key>.config) and the gateway never routes it.
func (s *Server) Reveal(_ context.Context, req *configv1.RevealRequest) (*configv1.RevealResponse, error) {
	if !configschema.Readable(req.GetProp()) {
		return nil, invalidArg("unknown config property `%s`", req.GetProp())
	}
	snap := s.current()
	raw, ok := configschema.Get(snap.doc, req.GetProp())
	if !ok {
		return &configv1.RevealResponse{Revision: snap.revision}, nil
	}
	v, err := structpb.NewValue(raw)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", req.GetProp(), err)
	}
	return &configv1.RevealResponse{Found: true, Value: v, Revision: snap.revision}, nil
}

// Authorize answers for every service, under the live config.
func (s *Server) Authorize(_ context.Context, req *configv1.AuthorizeRequest) (*configv1.AuthorizeResponse, error) {
	if req.GetPermission() == "" {
		return nil, invalidArg("`permission` is required")
	}
	snap := s.current()
	d := snap.authorize(req.GetPrincipal(), req.GetPermission(), req.GetResource())
	return &configv1.AuthorizeResponse{Allowed: d.allowed, Reason: d.reason, Revision: snap.revision}, nil
}

// PluginValues returns the operator's values for one plugin instance,
// plugins.entries.<key>.config, unmasked, at the live revision, in
// Secrets. The config service has no plugin manifests, so it cannot tell
// which keys a plugin marks x-secret: the sandbox splits them with the
// manifest and never lets a secret reach __config. A request pinned to a
// revision that is no longer live is refused (Aborted), so one call frame
// never mixes two revisions.
func (s *Server) PluginValues(_ context.Context, req *configv1.PluginValuesRequest) (*configv1.PluginValuesResponse, error) {
	key := req.GetPluginKey()
	if key == "" || strings.ContainsAny(key, ". ") {
		return nil, invalidArg("`plugin_key` must be a plugin key without dots or spaces")
	}
	snap := s.current()
	if rev := req.GetRevision(); rev != 0 && rev != snap.revision {
		return nil, status.Errorf(codes.Aborted, "config revision %d is no longer live (now %d)", rev, snap.revision)
	}
	resp := &configv1.PluginValuesResponse{Revision: snap.revision, Secrets: map[string]string{}}
	raw, ok := configschema.Get(snap.doc, "plugins.entries."+key+".config")
	if !ok {
		return resp, nil
	}
	values, ok := raw.(map[string]any)
	if !ok {
		return nil, status.Errorf(codes.Internal, "plugins.entries.%s.config is not a map", key)
	}
	for k, v := range values {
		if str, ok := v.(string); ok {
			resp.Secrets[k] = str
		} else {
			resp.Secrets[k] = fmt.Sprint(v)
		}
	}
	return resp, nil
}
