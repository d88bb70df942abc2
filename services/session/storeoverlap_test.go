package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sessionv1 "github.com/clawmesh/clawmesh/proto/clawmesh/session/v1"
)

// withStoreHooks sets the temporary file's sync and the hook run once a
// store's rows are written, until the test ends.
func withStoreHooks(t *testing.T, sync func(*os.File) error, rows func()) {
	t.Helper()
	if sync != nil {
		storeSync.Store(&sync)
	}
	if rows != nil {
		storeRowsWritten.Store(&rows)
	}
	t.Cleanup(func() {
		storeSync.Store(nil)
		storeRowsWritten.Store(nil)
	})
}

// A new file's rows (the index, the charge, the upload's answer) are
// written while its temporary file syncs, once its hash is known, not
// after the sync: the sync here waits for them, and would wait in vain
// if they came after it. The store still answers only once the file is
// in place and durable and the rows are committed.
func TestStoreRowsAreWrittenWhileTheFileSyncs(t *testing.T) {
	h, _ := fileHarness(t)
	id := h.newSession(alice, "default")
	data := patterned(writeAheadMin+5, 3)
	rowsWritten := make(chan struct{})
	var synced atomic.Bool
	withStoreHooks(t, func(f *os.File) error {
		select {
		case <-rowsWritten:
		case <-time.After(10 * time.Second):
			return errors.New("the rows were not written while the file synced")
		}
		synced.Store(true)
		return f.Sync()
	}, func() {
		if synced.Load() {
			t.Error("the rows were written after the sync")
		}
		close(rowsWritten)
	})
	f, err := h.storeFile(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "f.bin", Data: data, UploadId: handUpload})
	if err != nil {
		t.Fatal(err)
	}
	if f.GetRefId() != "sha256:"+sha(data) || f.GetDeduplicated() {
		t.Fatalf("entry %v", f)
	}
	if got, err := os.ReadFile(f.GetWorkspacePath()); err != nil || sha(got) != sha(data) {
		t.Fatalf("the file in place: %v", err)
	}
	if names, n := h.stored(id); len(names) != 1 || n != 1 {
		t.Fatalf("stored %v, %d rows", names, n)
	}
	if b, n := h.usage(alice); b != int64(len(data)) || n != 1 {
		t.Fatalf("charged %d bytes, %d files", b, n)
	}
}

// A sync that fails after the rows were written takes them with it: the
// store fails, no row is visible, nothing is charged, and no file, not
// even the temporary one, is left.
func TestAFailedSyncLeavesNoRowsVisible(t *testing.T) {
	h, _ := fileHarness(t)
	id := h.newSession(alice, "default")
	data := patterned(writeAheadMin+5, 4)
	rowsWritten := make(chan struct{})
	withStoreHooks(t, func(*os.File) error {
		select {
		case <-rowsWritten:
		case <-time.After(10 * time.Second):
		}
		return errors.New("disk gone")
	}, func() { close(rowsWritten) })
	_, err := h.storeFile(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "f.bin", Data: data, UploadId: handUpload})
	if err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("a store whose sync failed: %v", err)
	}
	select {
	case <-rowsWritten:
	default:
		t.Fatal("the rows were not written before the sync failed: the case is not the one meant")
	}
	h.nothingStored(id)
	if b, n := h.usage(alice); b != 0 || n != 0 {
		t.Fatalf("charged %d bytes, %d files for a failed store", b, n)
	}
	var answers int
	if err := h.pool.QueryRow(context.Background(), "SELECT count(*) FROM session_file_uploads WHERE session_id = $1", id).Scan(&answers); err != nil || answers != 0 {
		t.Fatalf("%d upload answers recorded (%v)", answers, err)
	}
	// The next store of the same file is a new one, stored whole.
	storeSync.Store(nil)
	storeRowsWritten.Store(nil)
	f := h.mustStore(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "f.bin", Data: data})
	if f.GetDeduplicated() {
		t.Fatalf("entry %v", f)
	}
}

// A row that fails to be written while the file syncs removes the file:
// the store fails, the temporary file is gone once the write and sync
// that ran beside the SQL ended, and nothing is charged. The failure is
// PostgreSQL's own (a trigger refusing the index's insert).
func TestAFailedRowLeavesNoFile(t *testing.T) {
	h, _ := fileHarness(t)
	id := h.newSession(alice, "default")
	ctx := context.Background()
	if _, err := h.pool.Exec(ctx, `CREATE FUNCTION refuse_file() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'index refused'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `CREATE TRIGGER refuse_file BEFORE INSERT ON session_files FOR EACH ROW EXECUTE FUNCTION refuse_file()`); err != nil {
		t.Fatal(err)
	}
	data := patterned(writeAheadMin+5, 6)
	syncing := make(chan struct{}, 1)
	withStoreHooks(t, func(f *os.File) error {
		syncing <- struct{}{}
		return f.Sync()
	}, nil)
	_, err := h.storeFile(&sessionv1.StoreFileRequest{Principal: alice, SessionId: id, Filename: "f.bin", Data: data, UploadId: handUpload})
	if err == nil || !strings.Contains(err.Error(), "index refused") {
		t.Fatalf("a store whose row was refused: %v", err)
	}
	if len(syncing) != 1 {
		t.Fatal("the file was not written and synced: the case is not the one meant")
	}
	h.nothingStored(id)
	if entries, _ := os.ReadDir(filepath.Join(h.dataDir, "workspaces", id, UploadsDir)); len(entries) != 0 {
		t.Fatalf("left %v", entries)
	}
	if b, n := h.usage(alice); b != 0 || n != 0 {
		t.Fatalf("charged %d bytes, %d files for a failed store", b, n)
	}
}
