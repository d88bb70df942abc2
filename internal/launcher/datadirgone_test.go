package launcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/testwait"
)

// The data directory removed, another folder put in its place (its inode
// number most often the removed one's), or its lock file removed, stops
// the stack with ErrDataDirRemoved, naming the directory and the command
// that starts it again; the same folder, left alone, stops nothing.
func TestDataDirRemovedStopsTheStack(t *testing.T) {
	for name, spoil := range map[string]func(dir string) error{
		"removed":           os.RemoveAll,
		"lock file removed": func(dir string) error { return os.Remove(filepath.Join(dir, "clawmesh.lock")) },
		"replaced": func(dir string) error {
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
			return os.Mkdir(dir, 0o700)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			unlock, locked, err := lock(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer unlock()
			was, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancelCause(context.Background())
			defer stop(nil)
			done := make(chan struct{})
			go func() {
				defer close(done)
				watchDataDir(ctx, dir, was, locked, time.Millisecond, stop, zap.NewNop())
			}()
			// Many polls of the folder as it was stop nothing.
			for range 20 {
				time.Sleep(time.Millisecond)
				if ctx.Err() != nil {
					t.Fatalf("stopped on the folder it started on: %v", context.Cause(ctx))
				}
			}
			if err := spoil(dir); err != nil {
				t.Fatal(err)
			}
			testwait.Recv(t, done)
			cause := context.Cause(ctx)
			if !errors.Is(cause, ErrDataDirRemoved) || !strings.Contains(cause.Error(), "clawmesh up --config-dir "+dir) {
				t.Fatalf("stopped with %v", cause)
			}
		})
	}
}
