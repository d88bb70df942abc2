package config

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strings"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	"github.com/clawmesh/clawmesh/internal/configschema"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	commonv1 "github.com/clawmesh/clawmesh/proto/clawmesh/common/v1"
	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// TokenPrefix starts every paired token.
const TokenPrefix = "cmt_"

// tokenID is what is stored of a token: its SHA-256, hexadecimal.
func tokenID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ResolvePrincipal binds a local peer (docs/spec.md §4). A token must be paired
// to an existing user, with no fallback; without one, the daemon's own
// uid is the operator and a uid named by users.<name>.uid is that user.
func (s *Server) ResolvePrincipal(_ context.Context, req *configv1.ResolvePrincipalRequest) (*configv1.ResolvePrincipalResponse, error) {
	snap := s.current()
	peer := func(p *commonv1.Principal) *configv1.ResolvePrincipalResponse {
		p.PeerUid, p.PeerPid = req.GetPeerUid(), req.GetPeerPid()
		return &configv1.ResolvePrincipalResponse{Principal: p, Permissions: snap.holds(p)}
	}
	if tok := req.GetAuthToken(); tok != "" {
		id := tokenID(tok)
		user, ok := snap.tokens[id]
		if !ok {
			return nil, rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex, "auth_token is not paired")
		}
		if !snap.userExists(user) {
			return nil, rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex,
				fmt.Sprintf("auth_token is paired with user %q, which no longer exists", user))
		}
		return peer(&commonv1.Principal{PrincipalId: configschema.UserPrincipal(user), User: user, TokenId: id}), nil
	}
	if peerIs(req.GetPeerUid(), int64(s.uid)) {
		return peer(&commonv1.Principal{PrincipalId: OperatorPrincipal, Operator: true}), nil
	}
	if user, ok := snap.userForUID(req.GetPeerUid()); ok {
		return peer(&commonv1.Principal{PrincipalId: configschema.UserPrincipal(user), User: user}), nil
	}
	return nil, rpcerr.Error(codes.Unauthenticated, rpcerr.ReasonAuthRequired, rpcerr.NoIndex,
		fmt.Sprintf("peer uid %d is not the daemon's user nor any users.<name>.uid; pair a token with 'clawmesh token create'", uint32(req.GetPeerUid())))
}

// CreateToken pairs a new token with an existing user. Only the operator
// (or an admin) may; the token is returned once and stored as a hash.
func (s *Server) CreateToken(ctx context.Context, req *configv1.CreateTokenRequest) (*configv1.CreateTokenResponse, error) {
	user := req.GetUser()
	if !configschema.ValidName(user) {
		return nil, invalidArg("`user` must name a users.<name> entry")
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	token := TokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
	id := tokenID(token)
	err := s.changeTokens(ctx, req.GetPrincipal(), func(cur *snapshot, tokens map[string]string) error {
		if !cur.userExists(user) {
			return rpcerr.Error(codes.NotFound, rpcerr.ReasonNotFound, rpcerr.NoIndex,
				fmt.Sprintf("user %q does not exist; set users.%s.permission_profiles first", user, user))
		}
		if _, err := s.db.Exec(ctx, "INSERT INTO tokens (token_hash, username) VALUES ($1, $2)", id, user); err != nil {
			return fmt.Errorf("store token: %w", s.failedWrite(err))
		}
		tokens[id] = user
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("token paired", zap.String("user", user), zap.String("by", req.GetPrincipal().GetPrincipalId()))
	return &configv1.CreateTokenResponse{Token: token, User: user}, nil
}

// RevokeToken unpairs every token of a user. A batch of the user's that
// waits for the config write lock is refused once it gets it.
func (s *Server) RevokeToken(ctx context.Context, req *configv1.RevokeTokenRequest) (*configv1.RevokeTokenResponse, error) {
	user := req.GetUser()
	if user == "" {
		return nil, invalidArg("`user` is required")
	}
	var n int64
	err := s.changeTokens(ctx, req.GetPrincipal(), func(_ *snapshot, tokens map[string]string) error {
		tag, err := s.db.Exec(ctx, "UPDATE tokens SET revoked_at = now() WHERE username = $1 AND revoked_at IS NULL", user)
		if err != nil {
			return fmt.Errorf("revoke tokens: %w", s.failedWrite(err))
		}
		n = tag.RowsAffected()
		maps.DeleteFunc(tokens, func(_, u string) bool { return u == user })
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("tokens revoked", zap.String("user", user), zap.Int64("revoked", n), zap.String("by", req.GetPrincipal().GetPrincipalId()))
	return &configv1.RevokeTokenResponse{Revoked: int32(n)}, nil
}

// changeTokens runs change on a copy of the paired tokens under the write
// lock and installs the copy when it succeeds. Pairing is the operator's.
func (s *Server) changeTokens(ctx context.Context, pr *commonv1.Principal, change func(cur *snapshot, tokens map[string]string) error) error {
	if err := s.lock(ctx); err != nil {
		return toStatus(err)
	}
	defer s.unlock()
	cur := s.current()
	if d := cur.authorize(pr, PermAdmin, ""); !d.allowed {
		return rpcerr.Error(codes.PermissionDenied, rpcerr.ReasonForbidden, rpcerr.NoIndex, "pairing tokens is the operator's: "+d.reason)
	}
	tokens := maps.Clone(cur.tokens)
	if err := change(cur, tokens); err != nil {
		return err
	}
	next := *cur
	next.tokens = tokens
	s.snap.Store(&next)
	return nil
}

// ApplyStartup commits the launcher's --set overrides (prop=value, the
// value typed by the schema: see configschema.ParseText) as one revision by
// "launcher", unless they are already in force. A bad override is an
// error that names it, and the process should exit.
func (s *Server) ApplyStartup(ctx context.Context, sets []string) error {
	if len(sets) == 0 {
		return nil
	}
	writes := make([]write, 0, len(sets))
	for _, kv := range sets {
		prop, raw, ok := strings.Cut(kv, "=")
		prop = strings.TrimSpace(prop)
		if !ok || prop == "" {
			return fmt.Errorf("--set %q: want prop=value", kv)
		}
		v, err := configschema.ParseText(prop, raw)
		if err != nil {
			return fmt.Errorf("--set %s: %w", prop, err)
		}
		writes = append(writes, write{prop: prop, value: v})
	}
	before := s.current().revision
	snap, err := s.commit(ctx, commitRequest{who: audit{by: LauncherAuthor}, writes: writes, skipUnchanged: true})
	if err != nil {
		var ee *entryError
		if errors.As(err, &ee) && ee.index >= 0 {
			return fmt.Errorf("--set %s: %w", writes[ee.index].prop, err)
		}
		return fmt.Errorf("--set: %w", err)
	}
	if snap.revision != before {
		s.log.Info("startup config committed", zap.Int64("revision", snap.revision))
	}
	return nil
}
