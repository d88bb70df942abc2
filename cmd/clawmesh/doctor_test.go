package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// A data directory that is a file is one failure, said once with its
// fix. doctor went on to check the disk "under" the file (ok) and the
// secret key, seven bus credentials and the socket inside it, ten
// failures, nine of them "stat ...: not a directory".
func TestDoctorDataDirIsAFile(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres:///none") // no PostgreSQL check
	t.Setenv("ZEROCLAW_SOCKET", "")
	file := filepath.Join(t.TempDir(), "data")
	writeTestFile(t, file, []byte("not a folder"))
	var out strings.Builder
	err := doctorCmd([]string{"--config-dir", file}, &out)
	if err == nil {
		t.Fatalf("doctor passed:\n%s", out.String())
	}
	var about []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, file) {
			about = append(about, line)
		}
	}
	if len(about) != 1 || !strings.Contains(about[0], "FAIL  data directory") || !strings.Contains(out.String(), "fix: move it away") {
		t.Fatalf("doctor on a file:\n%s", out.String())
	}
}

// The version check asks status, which fails while the session service
// is down; doctor dropped the check without a word, and a reader took
// the missing line for a check that passed.
func TestDoctorSaysWhyTheVersionIsUnknown(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres:///none")
	var out strings.Builder
	_ = doctorCmd([]string{"--config-dir", t.TempDir(), "--socket", fakeStack(t)}, &out)
	if !strings.Contains(out.String(), "note  version") || !strings.Contains(out.String(), "session unavailable") {
		t.Fatalf("doctor with status failing:\n%s", out.String())
	}
}
