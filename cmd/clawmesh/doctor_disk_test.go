package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/testdisk"
)

// On a full disk the stack's health stays SERVING (it serves what needs
// no writes), and nothing a user could ask said the disk was full: doctor
// checked owners and modes only. It checks the free space now, and says
// so once there is room again.
func TestDoctorSaysTheDiskIsFull(t *testing.T) {
	disk := testdisk.New(t, 128<<20)
	var out bytes.Buffer
	d := &doctor{out: &out}
	d.diskSpace("disk space", disk.Dir)
	if d.failed != 0 || !strings.HasPrefix(out.String(), "ok") {
		t.Fatalf("an empty disk: %s", out.String())
	}
	disk.Fill()
	out.Reset()
	d.diskSpace("disk space", disk.Dir)
	if d.failed != 1 || !strings.Contains(out.String(), "free space on that disk") {
		t.Fatalf("a full disk: %s", out.String())
	}
	disk.Free()
	out.Reset()
	d.diskSpace("disk space", disk.Dir)
	if d.failed != 1 || !strings.HasPrefix(out.String(), "ok") {
		t.Fatalf("space back: %s", out.String())
	}
}
