package hostclock

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Early and Late bracket the kernel's CLOCK_MONOTONIC, read by a system
// call between them, and neither goes back.
func TestBracketsTheHostClock(t *testing.T) {
	var lastEarly, lastLate int64
	for range 1000 {
		e := Early()
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		l := Late()
		if raw := ts.Nano(); e > raw || raw > l {
			t.Fatalf("host clock %d outside [%d, %d]", raw, e, l)
		}
		if e < lastEarly || l < lastLate {
			t.Fatalf("went back: early %d after %d, late %d after %d", e, lastEarly, l, lastLate)
		}
		lastEarly, lastLate = e, l
	}
	if Uncertainty() < 0 {
		t.Fatalf("uncertainty %v", Uncertainty())
	}
}
