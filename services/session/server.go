// Package session is the session service: sessions, turns, the agent loop
// and its providers, the transcript, approvals and session workspaces.
//
// This first version serves Status from the stored sessions; the session
// methods of the socket come with their own issue and answer Unimplemented
// until then.
package session

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// Server implements sessionv1.SessionServiceServer.
type Server struct {
	sessionv1.UnimplementedSessionServiceServer

	db  *pgxpool.Pool
	log *zap.Logger
}

// New builds the service on its schema.
func New(db *pgxpool.Pool, log *zap.Logger) *Server {
	return &Server{db: db, log: log}
}

// Status lists the sessions that are open (idle or running).
func (s *Server) Status(ctx context.Context, _ *sessionv1.StatusRequest) (*sessionv1.StatusResponse, error) {
	rows, err := s.db.Query(ctx, "SELECT session_id FROM sessions WHERE state IN ('idle', 'running') ORDER BY updated_at DESC")
	if err != nil {
		return nil, fmt.Errorf("list open sessions: %w", err)
	}
	defer rows.Close()
	resp := &sessionv1.StatusResponse{SessionIds: []string{}}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("list open sessions: %w", err)
		}
		resp.SessionIds = append(resp.SessionIds, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list open sessions: %w", err)
	}
	resp.ActiveSessions = int64(len(resp.SessionIds))
	return resp, nil
}
