package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clawmesh/clawmesh/internal/pg"
	"github.com/clawmesh/clawmesh/internal/rpcerr"
	"github.com/clawmesh/clawmesh/internal/testdisk"
	"github.com/clawmesh/clawmesh/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A write the database refused for want of disk space (a transcript
// append, a config revision) reached the client as "<service> failed",
// an internal error like any bug: nothing said that freeing space would
// mend it. It is an unavailable dependency with its cause now, and health
// stays SERVING (the database answers; reads go on). Once space is back
// the same write succeeds, with no restart.
func TestDatabaseDiskFullIsSaid(t *testing.T) {
	disk := testdisk.New(t, 4<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	// A tablespace on the small disk, owned by the server's account.
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dataDir, &st); err != nil {
		t.Skipf("the database's folder is not on this machine: %v", err)
	}
	loc := filepath.Join(disk.Dir, "tablespace")
	if err := os.Mkdir(loc, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(loc, int(st.Uid), int(st.Gid)); err != nil {
		t.Fatal(err)
	}
	space := fmt.Sprintf("small_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE TABLESPACE "+space+" LOCATION '"+loc+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the disk goes
		ctx := context.Background()
		_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS transcript")
		if _, err := conn.Exec(ctx, "DROP TABLESPACE "+space); err != nil {
			t.Errorf("drop tablespace: %v", err)
		}
	})
	if _, err := conn.Exec(ctx, "CREATE TABLE transcript (body text) TABLESPACE "+space); err != nil {
		t.Fatal(err)
	}
	disk.Fill()

	var health []error
	appendRows := func() error {
		_, err := conn.Exec(ctx, "INSERT INTO transcript SELECT repeat('x', 1000) FROM generate_series(1, 2000)")
		return err
	}
	err = appendRows()
	if err == nil {
		t.Fatal("2 MB written on a full disk")
	}
	st2 := status.Convert(classifyDatabase(fmt.Errorf("append message: %w", err), func(err error) { health = append(health, err) }))
	if reason, _ := rpcerr.Details(st2); st2.Code() != codes.Unavailable || reason != rpcerr.ReasonDependency ||
		st2.Message() != ErrDatabaseDiskFull.Error() {
		t.Fatalf("a full disk classified as %v (the database said %v)", st2, err)
	}
	if len(health) != 0 {
		t.Fatalf("health changed on a full disk: %v", health)
	}
	// Still reachable: a read answers.
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM transcript").Scan(&n); err != nil {
		t.Fatalf("a read on a full disk: %v", err)
	}

	disk.Free()
	if err := appendRows(); err != nil {
		t.Fatalf("space back: %v", err)
	}
	// Anything else is not the database's disk.
	if got := classifyDatabase(errors.New("encode: bad value"), func(error) {}); got != nil {
		t.Fatalf("a plain error classified as %v", got)
	}
	if got := classifyDatabase(pg.ErrUnavailable, func(error) {}); status.Code(got) != codes.Unavailable {
		t.Fatalf("an unreachable database classified as %v", got)
	}
}
