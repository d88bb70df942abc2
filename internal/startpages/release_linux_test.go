package startpages

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssFileKB reads RssFile of this process (the resident pages backed by
// files, the executable's among them).
func rssFileKB(t *testing.T) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "RssFile:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	t.Skip("no RssFile")
	return 0
}

// Release advises the executable's read-only mappings, the resident pages
// backed by files shrink, and the process goes on running (what it
// touches next faults back in).
func TestReleaseGivesBackTheExecutablesPages(t *testing.T) {
	before := rssFileKB(t)
	advised := Release()
	if advised <= 0 {
		t.Fatalf("Release advised %d bytes: no read-only mapping of the executable found", advised)
	}
	after := rssFileKB(t)
	t.Logf("advised %d KiB; RssFile %d -> %d KiB", advised>>10, before, after)
	if after >= before {
		t.Errorf("RssFile did not shrink: %d -> %d KiB", before, after)
	}
}
