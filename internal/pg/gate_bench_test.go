package pg

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/clawmesh/clawmesh/internal/testenv"
)

// BenchmarkGate is what a watched pool's gate adds to one pool.Exec made
// with a deadline, without the round trip BenchmarkExec's figures are
// mostly made of: the acquisition's context, which the pool checks once,
// and the statement's, on which pgx watches the caller's cancellation
// (context.AfterFunc, as its ctxwatch does).
func BenchmarkGate(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.Postgres(b))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, watched := range []bool{false, true} {
		name := "unwatched"
		if watched {
			name = "watched"
		}
		b.Run(name, func(b *testing.B) {
			g := &gate{kick: make(chan struct{}, 1)}
			if watched {
				g.watchers.Add(1)
			}
			b.ReportAllocs()
			for b.Loop() {
				a := g.enter(ctx)
				_ = a.Done()
				s := g.enterStatement(ctx, conn)
				stop := context.AfterFunc(s, func() {})
				stop()
				g.leaveStatement(s, conn)
				g.leave(a)
			}
		})
	}
}
