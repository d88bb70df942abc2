package config

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	configv1 "github.com/clawmesh/clawmesh/proto/clawmesh/config/v1"
)

// BenchmarkSetMany measures committed config/set-many batches per second
// against a real PostgreSQL (and NATS): authority, staging, whole-document
// validation, encryption, one INSERT and COMMIT, publication. The
// baseline is the bare INSERT+COMMIT of one revision row, in
// the same run (a small document: the floor of one commit).
func BenchmarkSetMany(b *testing.B) {
	for _, size := range []int{1, 256} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			e := newEnv(b, nil)
			e.mustSet(kv{"agents.default.api_key", "sk-bench"}) // one secret to encrypt each time
			ctx := context.Background()
			sets := make([]*configv1.Entry, size)
			n := 0
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				n++
				for i := range sets {
					sets[i] = &configv1.Entry{Prop: fmt.Sprintf("agents.a%d.model", i), Value: structpb.NewStringValue(fmt.Sprint("m", n))}
				}
				if _, err := e.srv.SetMany(ctx, &configv1.SetManyRequest{Principal: operator, Sets: sets}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "batches/s")
		})
	}
	b.Run("baseline=insert", func(b *testing.B) {
		e := newEnv(b, nil)
		ctx := context.Background()
		doc := []byte(`{"agents":{"default":{"model":"m"}}}`)
		rev := int64(0)
		start := time.Now()
		for b.Loop() {
			rev++
			tx, err := e.opts.DB.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO revisions (revision, document, committed_by, props) VALUES ($1, $2, 'bench', '{}')", rev, doc); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(rev)/time.Since(start).Seconds(), "batches/s")
	})
}
