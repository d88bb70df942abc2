// Package config is the config service: the typed config document, its
// revisions, principals and authorization decisions.
//
// This first version stores the document and serves what the rest of the
// stack needs to start (Live, ResolvePrincipal); the config methods of the
// socket come with their own issue and answer Unimplemented until then.
package config

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/clawmesh/clawmesh/internal/rpcerr"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// OperatorPrincipal is the principal of a local peer with the daemon's uid.
const OperatorPrincipal = "shared-operator"

// Server implements configv1.ConfigServiceServer.
type Server struct {
	configv1.UnimplementedConfigServiceServer

	db  *pgxpool.Pool
	log *zap.Logger
	uid int

	mu       sync.RWMutex
	revision int64
	document map[string]any
}

// New loads the stored document (revision 0 and an empty document on a
// new database).
func New(ctx context.Context, db *pgxpool.Pool, log *zap.Logger) (*Server, error) {
	s := &Server{db: db, log: log, uid: os.Getuid(), document: map[string]any{}}
	var raw []byte
	err := db.QueryRow(ctx, "SELECT revision, document FROM revisions ORDER BY revision DESC LIMIT 1").Scan(&s.revision, &raw)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("load config: %w", err)
	default:
		if err := json.Unmarshal(raw, &s.document); err != nil {
			return nil, fmt.Errorf("decode stored config: %w", err)
		}
	}
	return s, nil
}

// ApplyStartup commits the launcher's --set overrides (prop=value, value
// read as JSON when it parses, else as a string) as one revision, unless
// they are already in force.
func (s *Server) ApplyStartup(ctx context.Context, sets []string) error {
	if len(sets) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	candidate := cloneDoc(s.document)
	var props []string
	for _, kv := range sets {
		prop, raw, ok := strings.Cut(kv, "=")
		prop = strings.TrimSpace(prop)
		if !ok || prop == "" {
			return fmt.Errorf("--set %q: want prop=value", kv)
		}
		var v any
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			v = raw
		}
		if err := setPath(candidate, prop, v); err != nil {
			return fmt.Errorf("--set %s: %w", prop, err)
		}
		props = append(props, prop)
	}
	before, _ := json.Marshal(s.document)
	after, _ := json.Marshal(candidate)
	if string(before) == string(after) {
		return nil
	}
	next := s.revision + 1
	if _, err := s.db.Exec(ctx, "INSERT INTO revisions (revision, document, committed_by, props) VALUES ($1, $2, $3, $4)",
		next, after, "launcher", props); err != nil {
		return fmt.Errorf("commit startup config: %w", err)
	}
	s.revision, s.document = next, candidate
	s.log.Info("startup config committed", zap.Int64("revision", next), zap.Strings("props", props))
	return nil
}

// Live returns the whole document and its revision.
func (s *Server) Live(context.Context, *configv1.LiveRequest) (*configv1.LiveResponse, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	doc, err := structpb.NewStruct(s.document)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode config: %v", err)
	}
	return &configv1.LiveResponse{Revision: s.revision, Document: doc}, nil
}

// ResolvePrincipal binds a local peer: the daemon's own uid is the
// operator; a token must be paired, with no fallback to the operator.
func (s *Server) ResolvePrincipal(ctx context.Context, req *configv1.ResolvePrincipalRequest) (*configv1.ResolvePrincipalResponse, error) {
	if req.GetAuthToken() != "" {
		sum := sha256.Sum256([]byte(req.GetAuthToken()))
		var user string
		err := s.db.QueryRow(ctx, "SELECT username FROM tokens WHERE token_hash = $1 AND revoked_at IS NULL",
			hex.EncodeToString(sum[:])).Scan(&user)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex, "auth_token is not paired")
		}
		if err != nil {
			return nil, fmt.Errorf("look up token: %w", err)
		}
		return &configv1.ResolvePrincipalResponse{Principal: &configv1.Principal{
			PrincipalId: "user:" + user, User: user, PeerUid: req.GetPeerUid(), PeerPid: req.GetPeerPid(),
		}}, nil
	}
	if int(req.GetPeerUid()) == s.uid {
		return &configv1.ResolvePrincipalResponse{Principal: &configv1.Principal{
			PrincipalId: OperatorPrincipal, Operator: true, PeerUid: req.GetPeerUid(), PeerPid: req.GetPeerPid(),
		}}, nil
	}
	return nil, rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex,
		fmt.Sprintf("peer uid %d is not the daemon's user; pair a token with 'clawmesh token create'", req.GetPeerUid()))
}

func cloneDoc(doc map[string]any) map[string]any {
	raw, _ := json.Marshal(doc)
	out := map[string]any{}
	_ = json.Unmarshal(raw, &out)
	return out
}

// setPath sets a dotted path in doc, creating objects on the way.
func setPath(doc map[string]any, path string, v any) error {
	parts := strings.Split(path, ".")
	cur := doc
	for i, p := range parts {
		if p == "" {
			return errors.New("empty path segment")
		}
		if i == len(parts)-1 {
			cur[p] = v
			return nil
		}
		next, ok := cur[p].(map[string]any)
		if !ok {
			if _, exists := cur[p]; exists {
				return fmt.Errorf("%s is not an object", strings.Join(parts[:i+1], "."))
			}
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	return nil
}
